#pragma once
// The pieces the parameterised CP test grids share (cp_equivalence, cp_positions, cp_sink and the
// one-GPU test): mask and head cases, the strategy's part of a test name, the strategy x cp x format
// loop and the grid cell of the CPU grids, the CpCase of one cell, its support-matrix query, and the
// per-rank comparison of out, lse, dq, dk, dv against the reference.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "attention/cp/cp_support.h"
#include "tests/attention/cp/cp_harness.h"

namespace cpf::cp::testing {

struct MaskCase {
  const char* name;
  MaskType mask;
  AttentionWindow window;
};

struct HeadCase {
  const char* name;
  int64_t heads, kv_heads, d_qk, d_v;
};

// "<strategy>_cp<n>_<format>": gtest names allow only letters, digits and '_', so a2a+p2p is a2a_p2p.
inline std::string strategy_test_name(CommType comm, int cp, QkvFormat format) {
  std::string name = comm_type_name(comm);
  for (char& ch : name) {
    if (ch == '+') ch = '_';
  }
  std::ostringstream os;
  os << name << "_cp" << cp << "_" << qkv_format_name(format);
  return os.str();
}

// The CPU grids' strategies: every strategy at cp 2 and 4 (a2a+p2p only as 2 x 2), every format;
// fn(comm, cp, format) adds the cells of one.
template <class Fn>
void for_each_strategy(Fn&& fn) {
  for (CommType comm : {CommType::p2p, CommType::all_gather, CommType::a2a, CommType::a2a_p2p}) {
    for (int cp : {2, 4}) {
      if (comm == CommType::a2a_p2p && cp != 4) continue;  // a2a+p2p runs as 2 x 2
      for (QkvFormat format : {QkvFormat::bshd, QkvFormat::sbhd, QkvFormat::thd}) fn(comm, cp, format);
    }
  }
}

// A cell of a CPU grid: strategy, cp size, format, mask and head case.
struct GridParam {
  CommType comm;
  int cp;
  QkvFormat format;
  MaskCase mask;
  HeadCase heads;
};

// "<strategy>_cp<n>_<format>_<mask>_<heads>"
inline std::string grid_param_name(const ::testing::TestParamInfo<GridParam>& info) {
  const GridParam& p = info.param;
  std::ostringstream os;
  os << strategy_test_name(p.comm, p.cp, p.format) << "_" << p.mask.name << "_" << p.heads.name;
  return os.str();
}

// gtest would print a GridParam's bytes, padding included (uninitialised under valgrind); its name says it.
inline void PrintTo(const GridParam& p, std::ostream* os) {
  *os << comm_type_name(p.comm) << " cp" << p.cp << " " << qkv_format_name(p.format) << " " << p.mask.name << " "
      << p.heads.name;
}

// One grid cell: a2a+p2p runs as 2 x (cp / 2), the global sequence is 8 tokens per rank.
inline CpCase grid_case(CommType comm, int cp, QkvFormat format, MaskType mask, AttentionWindow window,
                        const HeadCase& heads) {
  CpCase c;
  c.comm = comm;
  c.cp = cp;
  c.a2a = comm == CommType::a2a_p2p ? 2 : 1;
  c.format = format;
  c.mask = mask;
  c.window = window;
  c.heads = heads.heads;
  c.kv_heads = heads.kv_heads;
  c.d_qk = heads.d_qk;
  c.d_v = heads.d_v;
  c.seq = 8 * c.cp;
  return c;
}

// The support-matrix question a case asks (self-attention; with a sink when c.sink).
inline CpQuery query_of(const CpCase& c) {
  return CpQuery{c.comm, c.cp, c.a2a, c.format, c.mask, c.window, c.heads, c.kv_heads, c.d_qk, c.d_v, false, c.sink};
}

// Every rank's out, lse, dq, dk, dv equal its shard of the single-rank result (fp32,
// |a - b| <= 2e-6 + 1e-5 |b|).
inline void expect_shards_equal_reference(const CpCase& c, const Global& g, const Tensors& ref,
                                          const std::vector<Tensors>& cp) {
  const int64_t lse_dim = c.format == QkvFormat::thd ? 1 : 2;
  for (int r = 0; r < c.cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Tensors& got = cp[static_cast<size_t>(r)];
    EXPECT_TRUE(::cpf::testing::all_close(got.out, shard(c, g, ref.out, g.seq_dim, r), 2e-6, 1e-5)) << "out";
    EXPECT_TRUE(::cpf::testing::all_close(got.lse, shard(c, g, ref.lse, lse_dim, r), 2e-6, 1e-5)) << "lse";
    EXPECT_TRUE(::cpf::testing::all_close(got.dq, shard(c, g, ref.dq, g.seq_dim, r), 2e-6, 1e-5)) << "dq";
    EXPECT_TRUE(::cpf::testing::all_close(got.dk, shard(c, g, ref.dk, g.seq_dim, r), 2e-6, 1e-5)) << "dk";
    EXPECT_TRUE(::cpf::testing::all_close(got.dv, shard(c, g, ref.dv, g.seq_dim, r), 2e-6, 1e-5)) << "dv";
  }
}

}  // namespace cpf::cp::testing
