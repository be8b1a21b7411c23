// The row-range driver shared by the decode GEMVs (matmul_q8_gemv_avx512.cpp,
// matmul_bf16_gemv_avx512.cpp): a range of rows is cut into NS equal sub-ranges that are
// streamed side by side (NS memory streams per thread), the remainder one row at a time.
// RowsFn<NS> computes rows[0..NS) for the tokens of the call; the per-output arithmetic does
// not depend on NS, so the grouping changes no bit.
#pragma once
#include <cstdint>

namespace alloy::cpu::mm {

template <int NS, class RowsNS, class Rows1>
inline void stream_rows(int64_t r0, int64_t nr, RowsNS&& rows_ns, Rows1&& rows_1) {
    const int64_t per = nr / NS;
    int64_t rows[NS];
    for (int64_t i = 0; i < per; ++i) {
        for (int s = 0; s < NS; ++s) rows[s] = r0 + s * per + i;
        rows_ns(rows);
    }
    for (int64_t r = r0 + NS * per; r < r0 + nr; ++r) rows_1(&r);
}

}  // namespace alloy::cpu::mm
