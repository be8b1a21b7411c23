// Opening a model file: the GGUF mapping, the bound model and (when the file carries one)
// its tokenizer, in one place so every subcommand opens models the same way.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "format/gguf.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace alloy {

struct LoadedModel {
    std::shared_ptr<gguf::File> file;
    std::unique_ptr<Qwen35Model> model;
    std::unique_ptr<ModelRunner> runner;  // the forward of `model` on its backend
    std::optional<Tokenizer> tokenizer;  // absent when the GGUF has no tokenizer.ggml.* keys

    const Tokenizer& require_tokenizer() const;  // throws naming the file
};

// The weights are read into memory on 2 MiB pages (format/resident_bytes.h: faster to stream
// than the file mapping) unless `where` is TensorData::Mapped (the commands' --mmap).
// `backend`: the runner's (runtime/backend.h make_backend: "cpu", "cuda").
// `tensor_parallel` > 1 (or expert_parallel): the model split over that many ranks of
// `backend` (runtime/tensor_parallel_backend.h), with the experts placed whole when expert_parallel.
LoadedModel load_model(const std::string& path, gguf::TensorData where = gguf::TensorData::Resident,
                       const std::string& backend = "cpu", int tensor_parallel = 1, bool expert_parallel = false);

// The default model's file name: a tiny Qwen3.5 trained on the King James Bible, with its MTP
// head (testdata/default-model/SOURCE.md), unpacked into share/alloy/ by the build.
inline constexpr const char* kDefaultModelFile = "alloy-default-kjv.gguf";

// The default model: the trained one in share/alloy/ beside the binary or in its install
// prefix; else (a binary copied alone) a tiny random-weight Qwen3.5 with the built-in Qwen3.5
// vocabulary, written on first use to $ALLOY_HOME or ~/.cache/alloy (no download), with a note
// on stderr. Returns its path.
std::string default_model_path();

}  // namespace alloy
