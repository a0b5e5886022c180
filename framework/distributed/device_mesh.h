#pragma once
// DeviceMesh: the world split into data-parallel (dp) and context-parallel (cp) groups, and the cp
// group split again for hierarchical CP (a2a inside, p2p ring outside; see docs/cp_design.md, "a2a+p2p: hierarchical").
//
//   world = dp x cp,   cp = cp_a2a x cp_p2p
//   global rank   g = d * cp + c            (cp is innermost: a CP group is a run of cp ranks)
//   cp index      c = q * cp_a2a + a        (a2a is innermost inside the CP group)
//
// Example, world 8 = dp 2 x cp 4, cp 4 = a2a 2 x p2p 2:
//
//            cp index c:  0   1   2   3
//     dp 0 (cp group):  [ 0   1 | 2   3 ]     a2a groups {0,1} {2,3} {4,5} {6,7}
//     dp 1 (cp group):  [ 4   5 | 6   7 ]     p2p groups {0,2} {1,3} {4,6} {5,7}
//     dp groups: the columns {0,4} {1,5} {2,6} {3,7}
//
// This matches TransformerEngine's hierarchical CP (a2a groups {0,1},{2,3}, p2p groups {0,2},{1,3}
// for cp = 4) and its ring lookup cp_ranks[p2p_rank * cp_a2a + a2a_rank]. The a2a group should sit
// on the fastest links (NVLink), hence innermost.
#include <string>
#include <vector>

#include "framework/distributed/process_group.h"

namespace cpf::dist {

struct MeshShape {
  int dp = 0;  // 0: world size / cp
  int cp = 1;
  int cp_a2a = 0;  // 0: cp / cp_p2p when cp_p2p is given, else 1 (plain p2p uses the whole cp group)
  int cp_p2p = 0;  // 0: cp / cp_a2a
  // Context parallelism was asked for (a CP strategy is configured): cp must be > 1, so a missing
  // group cannot silently run with one rank (Megatron-Bridge #2667).
  bool require_cp = false;
  // Hierarchical a2a+p2p was asked for: cp_a2a and cp_p2p must both be > 1.
  bool hierarchical_cp = false;
};

// Which global ranks form each group; pure arithmetic, the same on every rank.
class MeshLayout {
 public:
  // Resolves the zeros in `shape` and validates it against the world size.
  MeshLayout(int world_size, const MeshShape& shape);

  int world_size() const { return world_; }
  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int cp_a2a() const { return a2a_; }
  int cp_p2p() const { return p2p_; }

  struct Coord {
    int dp = 0;   // which cp group (= rank in the dp group)
    int cp = 0;   // rank in the cp group
    int a2a = 0;  // rank in the a2a group
    int p2p = 0;  // rank in the p2p group
  };
  Coord coord(int global_rank) const;
  int global_rank(int dp_index, int cp_index) const { return dp_index * cp_ + cp_index; }

  std::vector<std::vector<int>> dp_groups() const;
  std::vector<std::vector<int>> cp_groups() const;
  std::vector<std::vector<int>> a2a_groups() const;
  std::vector<std::vector<int>> p2p_groups() const;

  // The sizes and a table of global ranks (rows: dp index; columns: cp index, '|' between a2a groups).
  std::string str() const;

 private:
  int world_, dp_, cp_, a2a_, p2p_;
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank calls it with the same shape. Creates the dp, cp, cp_a2a
  // and cp_p2p groups (named so) with world->new_group.
  DeviceMesh(const ProcessGroupPtr& world, const MeshShape& shape);

  const MeshLayout& layout() const { return layout_; }
  const MeshLayout::Coord& coord() const { return coord_; }
  const ProcessGroupPtr& world() const { return world_; }
  const ProcessGroupPtr& dp() const { return dp_; }
  const ProcessGroupPtr& cp() const { return cp_; }
  const ProcessGroupPtr& cp_a2a() const { return a2a_; }
  const ProcessGroupPtr& cp_p2p() const { return p2p_; }

  // Throws "<who> needs context parallelism, but the CP group has size 1 (...)" when cp == 1.
  void require_cp(const std::string& who) const;

 private:
  MeshLayout layout_;
  MeshLayout::Coord coord_;
  ProcessGroupPtr world_, dp_, cp_, a2a_, p2p_;
};

}  // namespace cpf::dist
