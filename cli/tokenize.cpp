// alloy tokenize -m MODEL_OR_TOKENIZER_JSON [--special] [--write-json OUT]
// Reads all of stdin and prints the token ids on one line, separated by single spaces.
// Without --special the input is plain text (<|im_start|> is spelled out as ordinary
// pieces); with it, special and added tokens are matched verbatim.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "alloy/error.h"
#include "alloy/tokenize.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace alloy::cli {

void add_tokenize_command(CLI::App& app) {
    struct Options {
        std::string model;
        bool special = false;
        std::string write_json;
    };
    auto opt = std::make_shared<Options>();
    auto* cmd = app.add_subcommand("tokenize", "print the token ids of stdin");
    cmd->add_option("-m,--model", opt->model, "GGUF model (a file or a name in $ALLOY_MODELS), a Hugging Face tokenizer.json or a .tiktoken ranks file")->required();
    cmd->add_flag("--special", opt->special, "parse special tokens such as <|im_start|> in the input");
    cmd->add_option("--write-json", opt->write_json,
                    "write the vocabulary as a Hugging Face tokenizer.json to this path instead (stdin is not read)");
    cmd->callback([opt] {
        if (!opt->write_json.empty()) {
            write_tokenizer_json(resolve_model(opt->model), opt->write_json);
            return;
        }
        std::ios::sync_with_stdio(false);
        std::cin >> std::noskipws;
        const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
        if (std::cin.bad()) throw Error("tokenize: cannot read stdin");
        std::string line;
        for (int32_t id : tokenize_text(resolve_model(opt->model), text, opt->special)) {
            if (!line.empty()) line += ' ';
            line += std::to_string(id);
        }
        line += '\n';
        if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size() || std::fflush(stdout) != 0)
            throw Error("tokenize: cannot write stdout");
    });
}

}  // namespace alloy::cli
