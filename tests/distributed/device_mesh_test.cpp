// DeviceMesh: the group layouts for dp x cp = 1x4, 2x2, 4x1 and hierarchical cp = 2x2, checked as
// arithmetic and as live groups (each group's all_reduce of the members' global ranks).
#include "framework/distributed/device_mesh.h"

#include <gtest/gtest.h>

#include <numeric>

#include "distributed/dist_test_utils.h"

namespace cpf::testing {
namespace {

using dist::DeviceMesh;
using dist::MeshLayout;
using dist::MeshShape;
using Groups = std::vector<std::vector<int>>;

TEST(DeviceMeshTest, LayoutOneByFour) {
  const MeshLayout layout(4, {.dp = 1, .cp = 4});
  EXPECT_EQ(layout.dp_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(layout.cp_groups(), (Groups{{0, 1, 2, 3}}));
  // Plain CP: the p2p ring is the whole cp group, the a2a groups are single ranks.
  EXPECT_EQ(layout.p2p_groups(), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(layout.a2a_groups(), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(DeviceMeshTest, LayoutTwoByTwo) {
  const MeshLayout layout(4, {.dp = 2, .cp = 2});
  EXPECT_EQ(layout.dp_groups(), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(layout.cp_groups(), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(layout.coord(3).dp, 1);
  EXPECT_EQ(layout.coord(3).cp, 1);
}

TEST(DeviceMeshTest, LayoutFourByOne) {
  const MeshLayout layout(4, {.cp = 1});  // dp derived
  EXPECT_EQ(layout.dp(), 4);
  EXPECT_EQ(layout.dp_groups(), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(layout.cp_groups(), (Groups{{0}, {1}, {2}, {3}}));
}

TEST(DeviceMeshTest, HierarchicalCpMatchesTransformerEngine) {
  // TE's a2a+p2p test: cp 4 = a2a 2 x p2p 2, a2a groups {0,1},{2,3}, p2p groups {0,2},{1,3}.
  const MeshLayout layout(4, {.cp = 4, .cp_a2a = 2, .hierarchical_cp = true});
  EXPECT_EQ(layout.cp_p2p(), 2);
  EXPECT_EQ(layout.a2a_groups(), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(layout.p2p_groups(), (Groups{{0, 2}, {1, 3}}));
  // TE's ring lookup: cp_ranks[p2p_rank * cp_a2a + a2a_rank] is the rank itself.
  for (int g = 0; g < 4; ++g) {
    const auto c = layout.coord(g);
    EXPECT_EQ(c.p2p * layout.cp_a2a() + c.a2a, c.cp);
  }
  const MeshLayout big(8, {.dp = 2, .cp = 4, .cp_a2a = 2, .cp_p2p = 2});
  EXPECT_EQ(big.a2a_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(big.p2p_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(big.dp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(big.str(),
            "world 8 = dp 2 x cp 4 (cp = a2a 2 x p2p 2)\n"
            "  dp 0: [ 0 1 | 2 3 ]\n"
            "  dp 1: [ 4 5 | 6 7 ]\n");
}

TEST(DeviceMeshTest, RejectsSizesThatDoNotMultiply) {
  EXPECT_CPF_ERROR(MeshLayout(4, {.dp = 2, .cp = 3}), "DeviceMesh: dp=2 x cp=3 = 6 does not match the world size 4");
  EXPECT_CPF_ERROR(MeshLayout(4, {.cp = 3}),
                   "DeviceMesh: cp=3 does not divide the world size 4, so dp cannot be derived");
  EXPECT_CPF_ERROR(MeshLayout(8, {.cp = 4, .cp_a2a = 2, .cp_p2p = 3}),
                   "DeviceMesh: cp_a2a=2 x cp_p2p=3 = 6 does not match cp=4");
  EXPECT_CPF_ERROR(MeshLayout(6, {.cp = 6, .cp_a2a = 4}), "DeviceMesh: cp_a2a=4 does not divide cp=6");
  EXPECT_CPF_ERROR(MeshLayout(6, {.cp = 6, .cp_p2p = 4}), "DeviceMesh: cp_p2p=4 does not divide cp=6");
  EXPECT_CPF_ERROR(MeshLayout(4, {.dp = -1}),
                   "DeviceMesh: sizes must be positive (0 = derive dp, cp_a2a or cp_p2p), "
                   "got dp=-1 cp=1 cp_a2a=0 cp_p2p=0");
  EXPECT_CPF_ERROR(MeshLayout(4, {.cp = 0}), "got dp=0 cp=0");
  EXPECT_CPF_ERROR(MeshLayout(0, {}), "DeviceMesh: the world size must be positive, got 0");
  EXPECT_CPF_ERROR(MeshLayout(4, {.cp = 4}).coord(4), "DeviceMesh: rank 4 is out of range for a world of size 4");
}

TEST(DeviceMeshTest, RejectsACpGroupOfOneWhereCpWasAskedFor) {
  EXPECT_CPF_ERROR(MeshLayout(4, {.cp = 1, .require_cp = true}),
                   "DeviceMesh: context parallelism was requested but cp=1 (world 4 = dp 4 x cp 1)");
  EXPECT_CPF_ERROR(
      MeshLayout(4, {.cp = 4, .hierarchical_cp = true}),
      "DeviceMesh: hierarchical CP (a2a+p2p) needs cp_a2a > 1 and cp_p2p > 1, got dp=1 x cp=4, cp=cp_a2a 1 "
      "x cp_p2p 4");
  EXPECT_CPF_ERROR(MeshLayout(4, {.cp = 4, .cp_a2a = 4, .hierarchical_cp = true}),
                   "got dp=1 x cp=4, cp=cp_a2a 4 x cp_p2p 1");
}

struct LiveCase {
  int world;
  MeshShape shape;
};

class LiveMeshTest : public ::testing::TestWithParam<LiveCase> {};

// Each group's members and a collective over it: the sum of the members' global ranks.
void expect_group(const dist::ProcessGroupPtr& group, const Groups& layout_groups, int global_rank, const char* name) {
  ASSERT_NE(group, nullptr) << name;
  EXPECT_EQ(group->name(), name);
  for (const auto& members : layout_groups) {
    if (std::find(members.begin(), members.end(), global_rank) == members.end()) continue;
    EXPECT_EQ(group->global_ranks(), members) << name;
    EXPECT_EQ(group->global_rank(), global_rank) << name;
    const int64_t expected = std::accumulate(members.begin(), members.end(), int64_t{0});
    const Tensor sum = group->all_reduce(full({1}, global_rank, {.dtype = DType::i64}));
    EXPECT_EQ(sum.item<int64_t>(), expected) << name << " on rank " << global_rank;
  }
}

TEST_P(LiveMeshTest, GroupsMatchTheLayout) {
  const LiveCase c = GetParam();
  run_ranks(c.world, [&](RankContext& ctx) {
    const DeviceMesh mesh(ctx.world, c.shape);
    const MeshLayout& layout = mesh.layout();
    EXPECT_EQ(mesh.coord().dp, layout.coord(ctx.rank).dp);
    EXPECT_EQ(mesh.dp()->rank(), mesh.coord().dp);
    EXPECT_EQ(mesh.cp()->rank(), mesh.coord().cp);
    EXPECT_EQ(mesh.cp_a2a()->rank(), mesh.coord().a2a);
    EXPECT_EQ(mesh.cp_p2p()->rank(), mesh.coord().p2p);
    expect_group(mesh.dp(), layout.dp_groups(), ctx.rank, "dp");
    expect_group(mesh.cp(), layout.cp_groups(), ctx.rank, "cp");
    expect_group(mesh.cp_a2a(), layout.a2a_groups(), ctx.rank, "cp_a2a");
    expect_group(mesh.cp_p2p(), layout.p2p_groups(), ctx.rank, "cp_p2p");
    if (layout.cp() == 1) {
      EXPECT_CPF_ERROR(
          mesh.require_cp("cp_comm_type p2p"),
          "cp_comm_type p2p needs context parallelism, but the CP group has size 1 (world 4 = dp 4 x cp 1)");
    } else {
      mesh.require_cp("cp_comm_type p2p");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, LiveMeshTest,
                         ::testing::Values(LiveCase{4, {.dp = 1, .cp = 4}}, LiveCase{4, {.dp = 2, .cp = 2}},
                                           LiveCase{4, {.dp = 4, .cp = 1}},
                                           LiveCase{4, {.cp = 4, .cp_a2a = 2, .hierarchical_cp = true}},
                                           LiveCase{8, {.dp = 2, .cp = 4, .cp_a2a = 2, .cp_p2p = 2}}));

TEST(DeviceMeshTest, NullWorldIsRejected) {
  EXPECT_CPF_ERROR(DeviceMesh(nullptr, {}), "DeviceMesh: the world group is null");
}

}  // namespace
}  // namespace cpf::testing
