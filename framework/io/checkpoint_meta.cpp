#include "framework/io/checkpoint_meta.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "framework/io/tensor_integrity.h"

namespace cpf::io {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "cpformer-checkpoint";
constexpr const char* kMetaChecksumKey = "meta_checksum";
const std::string kMeta = kCheckpointMetaFile;

// meta.json's own checksum: over the compact dump of the object without that field. nlohmann::json
// keeps keys sorted and prints numbers and strings one way, so the text is canonical: reading the
// file back and dumping it again gives the same bytes whatever the file's indentation.
std::string canonical_checksum(json j) {
  j.erase(kMetaChecksumKey);
  const std::string text = j.dump();
  return tensor_checksum(text.data(), text.size());
}

bool is_checksum_text(const json& v) {
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// "checksums": {"model.safetensors": {"fc1.weight": "<16 hex digits>", ...}, ...}
std::map<std::string, TensorChecksums> parse_checksums(const json& j) {
  CPF_CHECK(j.contains("checksum_algorithm"), kMeta, " has no field 'checksum_algorithm'");
  CPF_CHECK(j["checksum_algorithm"] == kChecksumAlgorithm, kMeta, ": checksum_algorithm ",
            j["checksum_algorithm"].dump(), " is not \"", kChecksumAlgorithm, "\"");
  CPF_CHECK(j.contains("checksums") && j["checksums"].is_object(), kMeta,
            " has no object 'checksums' (file -> tensor -> checksum)");
  std::map<std::string, TensorChecksums> out;
  for (const auto& [file, tensors] : j["checksums"].items()) {
    CPF_CHECK(tensors.is_object(), kMeta, ": checksums of '", file, "' must be an object of tensor names");
    TensorChecksums& sums = out[file];
    for (const auto& [name, sum] : tensors.items()) {
      CPF_CHECK(is_checksum_text(sum), kMeta, ": checksum of '", name, "' in '", file,
                "' must be 16 lower-case hex digits, got ", sum.dump());
      sums[name] = sum.get<std::string>();
    }
  }
  return out;
}

// The fields every version has, after format, version and (version 2) the checksums are checked.
void parse_run_fields(const json& j, CheckpointMetaFile& out) {
  auto field = [&](const char* key) -> const json& {
    CPF_CHECK(j.contains(key), kMeta, " has no field '", key, "'");
    return j[key];
  };
  auto non_negative = [&](const char* key) {
    const json& v = field(key);
    CPF_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, kMeta, ": '", key, "' must be an integer >= 0, got ",
              v.dump());
    return v.get<int64_t>();
  };
  auto unsigned_field = [&](const char* key) {
    const json& v = field(key);
    CPF_CHECK(v.is_number_unsigned(), kMeta, ": '", key, "' must be an unsigned integer, got ", v.dump());
    return v.get<uint64_t>();
  };
  CheckpointMeta& m = out.meta;
  m.step = non_negative("step");
  m.rng_seed = unsigned_field("rng_seed");
  m.rng_offset = unsigned_field("rng_offset");
  const json& cursor = field("data_cursor");
  CPF_CHECK(cursor.is_number_integer(), kMeta, ": 'data_cursor' must be an integer, got ", cursor.dump());
  m.data_cursor = cursor.get<int64_t>();
  CPF_CHECK(field("config_hash").is_string(), kMeta, ": 'config_hash' must be a string");
  m.config_hash = field("config_hash").get<std::string>();
  const json& opt = field("optimizer");
  if (!opt.is_null()) {
    CPF_CHECK(opt.is_object() && opt.contains("name") && opt["name"].is_string() && !opt["name"].empty() &&
                  opt.contains("step_count") && opt["step_count"].is_number_integer() &&
                  opt["step_count"].get<int64_t>() >= 0,
              kMeta, ": 'optimizer' must be null or {\"name\": string, \"step_count\": integer >= 0}, got ",
              opt.dump());
    m.optimizer_name = opt["name"].get<std::string>();
    m.optimizer_step = opt["step_count"].get<int64_t>();
  }
  const json& files = field("files");
  CPF_CHECK(files.is_object(), kMeta, ": 'files' must be an object of byte sizes");
  for (const auto& [name, size] : files.items()) {
    CPF_CHECK(size.is_number_unsigned(), kMeta, ": size of '", name, "' must be an unsigned integer");
    out.file_sizes[name] = size.get<uint64_t>();
  }
  const json& extra = field("extra");
  CPF_CHECK(extra.is_object(), kMeta, ": 'extra' must be an object of strings");
  for (const auto& [key, value] : extra.items()) {
    CPF_CHECK(value.is_string(), kMeta, ": 'extra' value of '", key, "' is not a string: ", value.dump());
    m.extra[key] = value.get<std::string>();
  }
}

}  // namespace

std::string checkpoint_meta_json(const CheckpointMetaFile& file) {
  const CheckpointMeta& m = file.meta;
  json j;
  j["format"] = kFormat;
  j["version"] = file.shards > 0 ? kCheckpointVersionSharded : kCheckpointVersion;
  if (file.shards > 0) j["shards"] = file.shards;
  j["step"] = m.step;
  j["rng_seed"] = m.rng_seed;
  j["rng_offset"] = m.rng_offset;
  j["data_cursor"] = m.data_cursor;
  j["config_hash"] = m.config_hash;
  j["optimizer"] =
      m.optimizer_name.empty() ? json(nullptr) : json{{"name", m.optimizer_name}, {"step_count", m.optimizer_step}};
  j["files"] = file.file_sizes;
  j["extra"] = m.extra;
  j["checksum_algorithm"] = kChecksumAlgorithm;
  j["checksums"] = file.checksums;
  j[kMetaChecksumKey] = canonical_checksum(j);
  return j.dump(2) + "\n";
}

CheckpointMetaFile parse_checkpoint_meta(const std::string& text) {
  // The JSON parser stops at a NUL as if the text ended there: what follows would go unchecked.
  CPF_CHECK(text.find('\0') == std::string::npos, kMeta, " holds a NUL byte at offset ", text.find('\0'),
            " (corrupt file)");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    CPF_FAIL(kMeta, " is not valid JSON: ", e.what());
  }
  CPF_CHECK(j.is_object(), kMeta, " is not a JSON object");
  CPF_CHECK(j.contains("format") && j["format"] == kFormat, kMeta, ": format ",
            j.contains("format") ? j["format"].dump() : "(missing)", " is not \"", kFormat, "\"");
  CPF_CHECK(j.contains("version"), kMeta, " has no field 'version'");
  const json& version = j["version"];
  CPF_CHECK(version == kCheckpointVersion || version == kCheckpointVersionWithoutChecksums ||
                version == kCheckpointVersionSharded,
            kMeta, ": version ", version.dump(), " is not supported (expected ", kCheckpointVersionWithoutChecksums,
            " to ", kCheckpointVersionSharded, ")");
  CheckpointMetaFile out;
  out.version = version.get<int64_t>();
  if (out.version == kCheckpointVersionSharded) {
    CPF_CHECK(j.contains("shards") && j["shards"].is_number_integer() && j["shards"].get<int64_t>() >= 1, kMeta,
              ": version ", kCheckpointVersionSharded, " needs 'shards', an integer >= 1, got ",
              j.contains("shards") ? j["shards"].dump() : "(missing)");
    out.shards = j["shards"].get<int64_t>();
  }
  if (out.has_checksums()) {
    // First, so that a flipped bit anywhere in the file is reported as what it is.
    CPF_CHECK(j.contains(kMetaChecksumKey) && j[kMetaChecksumKey].is_string(), kMeta, " has no string field '",
              kMetaChecksumKey, "'");
    const std::string recorded = j[kMetaChecksumKey].get<std::string>();
    const std::string actual = canonical_checksum(j);
    CPF_CHECK(recorded == actual, kMeta, " fails its checksum (records ", recorded, ", its contents hash to ", actual,
              "): the file was modified or corrupted");
    out.checksums = parse_checksums(j);
  }
  parse_run_fields(j, out);
  return out;
}

}  // namespace cpf::io
