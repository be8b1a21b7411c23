// Qwen3.5 chat template: exact strings (checked against the Jinja template rendered with
// jinja2 for the same messages).
#include <gtest/gtest.h>

#include "alloy/error.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

TEST(ChatTemplate, SystemUserAndGenerationPromptThinkingOn) {
    EXPECT_EQ(apply_chat_template({{"system", "  You are helpful.\n", ""}, {"user", "Hi there!", ""}}, true, true),
              "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, GenerationPromptThinkingOff) {
    EXPECT_EQ(apply_chat_template({{"user", "Hi", ""}}, true, false),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, NoGenerationPrompt) {
    EXPECT_EQ(apply_chat_template({{"user", "Hi", ""}, {"assistant", "Hello.", ""}}, false, true),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n");
}

// Reasoning is shown only for assistant turns after the last user query; it may come from
// reasoning_content or from content before </think>.
TEST(ChatTemplate, ReasoningOnlyAfterLastUserQuery) {
    EXPECT_EQ(apply_chat_template({{"user", "Q1", ""},
                                   {"assistant", "A1", "R1"},
                                   {"user", "Q2", ""},
                                   {"assistant", "<think>\nR2 in content\n</think>\n\nA2", ""}},
                                  true, true),
              "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
              "<|im_start|>assistant\n<think>\nR2 in content\n</think>\n\nA2<|im_end|>\n<|im_start|>assistant\n<think>\n");
    EXPECT_EQ(apply_chat_template({{"user", "x", ""}, {"assistant", "a</think>b</think>\n\nc", ""}}, false, true),
              "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\na\n</think>\n\nc<|im_end|>\n");
}

// Consecutive tool results merge into one user turn; the tool turns do not end the query, so
// the answer after them is an assistant turn after the last query: its think block is written
// even empty (the Qwen3.5 template, rendered with jinja2: Qwen3's skipped an empty one).
TEST(ChatTemplate, ToolResponsesMerge) {
    EXPECT_EQ(apply_chat_template({{"user", "What is the weather?", ""},
                                   {"assistant", "Let me check.", " think about tools "},
                                   {"tool", "sunny", ""},
                                   {"tool", " 22C ", ""},
                                   {"assistant", "It is sunny, 22C.", ""}},
                                  true, false),
              "<|im_start|>user\nWhat is the weather?<|im_end|>\n"
              "<|im_start|>assistant\n<think>\nthink about tools\n</think>\n\nLet me check.<|im_end|>\n"
              "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n<think>\n\n</think>\n\nIt is sunny, 22C.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, RejectsWhatTheTemplateRejects) {
    EXPECT_THROW(apply_chat_template({}, true, true), Error);
    EXPECT_THROW(apply_chat_template({{"system", "s", ""}}, true, true), Error);  // no user query
    EXPECT_THROW(apply_chat_template({{"user", "<tool_response>x</tool_response>", ""}}, true, true), Error);
    EXPECT_THROW(apply_chat_template({{"user", "u", ""}, {"system", "late", ""}}, true, true), Error);
    EXPECT_THROW(apply_chat_template({{"user", "u", ""}, {"robot", "?", ""}}, true, true), Error);
}

}  // namespace
}  // namespace alloy
