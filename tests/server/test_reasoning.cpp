// The reasoning split (server/reasoning.h): the template's reading of an answer (reasoning
// before "</think>" without its leading/trailing newlines, content after it without its
// leading newlines), the same whether the answer comes whole or in pieces cut anywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/reasoning.h"

namespace alloy::server {
namespace {

std::pair<std::string, std::string> split(const std::vector<std::string>& pieces, bool in_reasoning = true) {
    ReasoningSplitter sp(in_reasoning);
    std::string r, c;
    for (const std::string& p : pieces) {
        const auto o = sp.push(p);
        r += o.reasoning;
        c += o.content;
    }
    const auto o = sp.flush();
    return {r + o.reasoning, c + o.content};
}

TEST(Reasoning, WholeAnswersAsTheTemplateReadsThem) {
    EXPECT_EQ(split({"\nLet me think.\nYes.\n\n</think>\n\nThe answer is 4."}),
              (std::pair<std::string, std::string>{"Let me think.\nYes.", "The answer is 4."}));
    EXPECT_EQ(split({"no close tag at all\n"}), (std::pair<std::string, std::string>{"no close tag at all", ""}));
    EXPECT_EQ(split({"</think>only content"}), (std::pair<std::string, std::string>{"", "only content"}));
    EXPECT_EQ(split({"a</think>b</think>c"}), (std::pair<std::string, std::string>{"a", "b</think>c"}));
    EXPECT_EQ(split({"thinking off: </think> stays"}, false),
              (std::pair<std::string, std::string>{"", "thinking off: </think> stays"}));
    EXPECT_EQ(split({"cut off in </th"}), (std::pair<std::string, std::string>{"cut off in </th", ""}));
}

TEST(Reasoning, EverySplitOfTheStreamGivesTheWholeAnswersPieces) {
    const std::string answer = "\n\nStep 1.\n\nStep 2 </thin k>.\n\n</think>\n\n\nDone: <think> is text here.\n";
    const auto want = split({answer});
    EXPECT_EQ(want.first, "Step 1.\n\nStep 2 </thin k>.");
    EXPECT_EQ(want.second, "Done: <think> is text here.\n");
    for (size_t a = 0; a <= answer.size(); ++a)
        for (size_t b = a; b <= answer.size(); b += 3)
            EXPECT_EQ(split({answer.substr(0, a), answer.substr(a, b - a), answer.substr(b)}), want) << a << " " << b;
    std::vector<std::string> chars;
    for (char ch : answer) chars.emplace_back(1, ch);
    EXPECT_EQ(split(chars), want);
}

}  // namespace
}  // namespace alloy::server
