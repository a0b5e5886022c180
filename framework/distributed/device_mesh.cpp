#include "framework/distributed/device_mesh.h"

#include <sstream>

#include "framework/core/error.h"

namespace cpf::dist {
namespace {

std::string sizes_str(int dp, int cp, int a2a, int p2p) {
  return str_cat("dp=", dp, " x cp=", cp, ", cp=cp_a2a ", a2a, " x cp_p2p ", p2p);
}

int world_size_of(const ProcessGroupPtr& world) {
  CPF_CHECK(world != nullptr, "DeviceMesh: the world group is null");
  return world->size();
}

}  // namespace

MeshLayout::MeshLayout(int world_size, const MeshShape& shape) : world_(world_size) {
  CPF_CHECK(world_size >= 1, "DeviceMesh: the world size must be positive, got ", world_size);
  CPF_CHECK(shape.dp >= 0 && shape.cp >= 1 && shape.cp_a2a >= 0 && shape.cp_p2p >= 0,
            "DeviceMesh: sizes must be positive (0 = derive dp, cp_a2a or cp_p2p), got dp=", shape.dp, " cp=", shape.cp,
            " cp_a2a=", shape.cp_a2a, " cp_p2p=", shape.cp_p2p);
  cp_ = shape.cp;
  if (shape.dp == 0) {
    CPF_CHECK(world_size % cp_ == 0, "DeviceMesh: cp=", cp_, " does not divide the world size ", world_size,
              ", so dp cannot be derived");
    dp_ = world_size / cp_;
  } else {
    dp_ = shape.dp;
  }
  CPF_CHECK(dp_ * cp_ == world_size, "DeviceMesh: dp=", dp_, " x cp=", cp_, " = ", dp_ * cp_,
            " does not match the world size ", world_size);

  a2a_ = shape.cp_a2a;
  p2p_ = shape.cp_p2p;
  if (a2a_ == 0 && p2p_ == 0) {
    a2a_ = 1;
    p2p_ = cp_;
  } else if (a2a_ == 0 || p2p_ == 0) {
    const int given = a2a_ == 0 ? p2p_ : a2a_;
    CPF_CHECK(cp_ % given == 0, "DeviceMesh: ", a2a_ == 0 ? "cp_p2p=" : "cp_a2a=", given, " does not divide cp=", cp_);
    (a2a_ == 0 ? a2a_ : p2p_) = cp_ / given;
  }
  CPF_CHECK(a2a_ * p2p_ == cp_, "DeviceMesh: cp_a2a=", a2a_, " x cp_p2p=", p2p_, " = ", a2a_ * p2p_,
            " does not match cp=", cp_);
  CPF_CHECK(!shape.require_cp || cp_ > 1, "DeviceMesh: context parallelism was requested but cp=1 (world ", world_size,
            " = dp ", dp_, " x cp ", cp_, "); set cp to the number of ranks that share a sequence");
  CPF_CHECK(!shape.hierarchical_cp || (a2a_ > 1 && p2p_ > 1),
            "DeviceMesh: hierarchical CP (a2a+p2p) needs cp_a2a > 1 and cp_p2p > 1, got ",
            sizes_str(dp_, cp_, a2a_, p2p_), "; with one level use plain a2a or p2p");
}

MeshLayout::Coord MeshLayout::coord(int global_rank) const {
  CPF_CHECK(global_rank >= 0 && global_rank < world_, "DeviceMesh: rank ", global_rank,
            " is out of range for a world of size ", world_);
  Coord c;
  c.dp = global_rank / cp_;
  c.cp = global_rank % cp_;
  c.a2a = c.cp % a2a_;
  c.p2p = c.cp / a2a_;
  return c;
}

std::vector<std::vector<int>> MeshLayout::dp_groups() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(cp_));
  for (int c = 0; c < cp_; ++c) {
    for (int d = 0; d < dp_; ++d) groups[static_cast<size_t>(c)].push_back(global_rank(d, c));
  }
  return groups;
}

std::vector<std::vector<int>> MeshLayout::cp_groups() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(dp_));
  for (int d = 0; d < dp_; ++d) {
    for (int c = 0; c < cp_; ++c) groups[static_cast<size_t>(d)].push_back(global_rank(d, c));
  }
  return groups;
}

std::vector<std::vector<int>> MeshLayout::a2a_groups() const {
  std::vector<std::vector<int>> groups;
  for (int d = 0; d < dp_; ++d) {
    for (int q = 0; q < p2p_; ++q) {
      std::vector<int> group;
      for (int a = 0; a < a2a_; ++a) group.push_back(global_rank(d, q * a2a_ + a));
      groups.push_back(std::move(group));
    }
  }
  return groups;
}

std::vector<std::vector<int>> MeshLayout::p2p_groups() const {
  std::vector<std::vector<int>> groups;
  for (int d = 0; d < dp_; ++d) {
    for (int a = 0; a < a2a_; ++a) {
      std::vector<int> group;
      for (int q = 0; q < p2p_; ++q) group.push_back(global_rank(d, q * a2a_ + a));
      groups.push_back(std::move(group));
    }
  }
  return groups;
}

std::string MeshLayout::str() const {
  std::ostringstream os;
  os << "world " << world_ << " = dp " << dp_ << " x cp " << cp_ << " (cp = a2a " << a2a_ << " x p2p " << p2p_ << ")\n";
  for (int d = 0; d < dp_; ++d) {
    os << "  dp " << d << ": [";
    for (int c = 0; c < cp_; ++c) {
      if (c > 0) os << (c % a2a_ == 0 ? " |" : "");
      os << " " << global_rank(d, c);
    }
    os << " ]\n";
  }
  return os.str();
}

DeviceMesh::DeviceMesh(const ProcessGroupPtr& world, const MeshShape& shape)
    : layout_(world_size_of(world), shape), coord_(layout_.coord(world->rank())), world_(world) {
  // Every rank takes part in every split, in the same order (a split is collective over the world); one
  // split makes all the groups of a dimension at once (512 thread ranks would otherwise run 1,500
  // new_group collectives).
  const auto make = [&](const std::vector<std::vector<int>>& groups, const char* name) {
    ProcessGroupPtr mine = world->split(groups, name);
    CPF_CHECK(mine != nullptr, "DeviceMesh: rank ", world->rank(), " is in no ", name, " group");
    return mine;
  };
  dp_ = make(layout_.dp_groups(), "dp");
  cp_ = make(layout_.cp_groups(), "cp");
  a2a_ = make(layout_.a2a_groups(), "cp_a2a");
  p2p_ = make(layout_.p2p_groups(), "cp_p2p");
}

void DeviceMesh::require_cp(const std::string& who) const {
  CPF_CHECK(layout_.cp() > 1, who, " needs context parallelism, but the CP group has size 1 (world ",
            layout_.world_size(), " = dp ", layout_.dp(), " x cp ", layout_.cp(), ")");
}

}  // namespace cpf::dist
