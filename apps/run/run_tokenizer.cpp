#include "apps/run/run_tokenizer.h"

#include <filesystem>

#include "framework/core/error.h"
#include "models/data/data_options.h"

namespace cpf::trainer {
namespace fs = std::filesystem;
namespace {

bool is_builtin(const std::string& spec) { return spec == "bytes" || spec == "gpt2"; }

// tokenizer.json or tokenizer.model, by the extension of the file it copies.
std::string recorded_name(const std::string& spec) {
  return fs::path(spec).extension() == ".model" ? "tokenizer.model" : "tokenizer.json";
}

}  // namespace

void record_run_tokenizer(const TrainConfig& config, const std::string& run_dir) {
  const std::string spec = models::data::effective_tokenizer(config.data);
  if (spec.empty() || is_builtin(spec)) return;
  const fs::path target = fs::path(run_dir) / recorded_name(spec);
  const fs::path tmp = fs::path(target).concat(".tmp");
  std::error_code ec;
  if (fs::exists(target, ec) && fs::equivalent(spec, target, ec)) return;  // trained from the run's own copy
  fs::copy_file(spec, tmp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::rename(tmp, target, ec);
  CPF_CHECK(!ec, "cannot record the tokenizer ", spec, " in the run folder as ", target.string(), " (", ec.message(),
            ")");
}

std::shared_ptr<const models::data::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint,
                                                                    const TrainConfig& config) {
  CPF_CHECK(config.data.source != "synthetic", "generate: ", checkpoint,
            " is a synthetic-task model; it has no text tokenizer");
  const std::string spec = models::data::effective_tokenizer(config.data);
  CPF_CHECK(!spec.empty(), "generate: ", checkpoint,
            " was trained on token shards with eot_token=", config.data.eot_token,
            " and no data.tokenizer, so its ids have no text; train with data.tokenizer set to "
            "the tokenizer the shards were made with (cpformer tokenize prints it)");
  if (is_builtin(spec)) return models::data::load_tokenizer(spec);
  const std::string name = recorded_name(spec);
  std::vector<fs::path> places = {fs::path(checkpoint).parent_path().parent_path() / name,
                                  fs::path(run_dir(config)) / name};
  std::error_code ec;
  for (const fs::path& place : places) {
    if (fs::is_regular_file(place, ec)) return models::data::load_tokenizer(place.string());
  }
  CPF_CHECK(fs::is_regular_file(spec, ec), "generate: the tokenizer of ", checkpoint,
            " is found neither in its run "
            "folder (",
            places[0].string(), ", ", places[1].string(), ") nor at data.tokenizer=", spec,
            "; copy the tokenizer file there");
  return models::data::load_tokenizer(spec);
}

}  // namespace cpf::trainer
