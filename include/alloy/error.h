// One error type for everything that comes from outside (files, requests, flags).
// Messages always name the file, tensor, field or request that was wrong.
#pragma once
#include <stdexcept>
#include <string>

namespace alloy {

struct Error : std::runtime_error {
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace alloy
