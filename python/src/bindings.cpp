// The _lowbit extension module: thin pybind11 wrappers over the library calls the CLI makes (src/cli/*.cpp), so
// Python sees the same models, results and errors. lowbit/__init__.py builds the Pythonic API on top. Long calls
// drop the GIL; a generation's text pieces come back through a callback that takes it again for each piece.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "lowbit/artifact/inspect.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/eval/perplexity.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/cuda_model.h"
#include "lowbit/model/generate.h"
#include "lowbit/quant/pipeline.h"

namespace py = pybind11;
using namespace lowbit;

namespace {

// JSON crosses as text: Python's json module parses it, so no converter has to be kept in step with nlohmann's.
py::object to_python(const nlohmann::json& j) { return py::module_::import("json").attr("loads")(j.dump()); }

// The process-wide thread pool runs one job at a time, so calls from several Python threads take turns. Each call
// locks this after dropping the GIL, so a thread waiting here never holds the GIL another one needs.
std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}

struct LoadedModel {
  std::filesystem::path path;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
};

std::shared_ptr<LoadedModel> load(const std::filesystem::path& path, const std::optional<std::filesystem::path>& tokenizer,
                                  const std::string& device) {
  py::gil_scoped_release release;
  auto m = std::make_shared<LoadedModel>();
  m->path = path;
  m->model = model::load_model(path, {.cpu_only = device == "cpu"});
  model::use_device(*m->model, device);
  m->tokenizer = model::load_tokenizer(path, tokenizer);
  return m;
}

py::dict stats_dict(const model::GenerateStats& stats) {
  py::dict d;
  d["prompt_tokens"] = stats.prompt_tokens;
  d["generated_tokens"] = stats.generated_tokens;
  d["prefill_seconds"] = stats.prefill_seconds;
  d["decode_seconds"] = stats.decode_seconds;
  d["stopped_at_eos"] = stats.stopped_at_eos;
  return d;
}

// A piece sink for the C++ streaming calls: hands each piece to the Python callable `emit` with the GIL held. An
// exception `emit` raises (the iterator closed, a stop string reached) unwinds out of the C++ call to Python.
std::function<void(std::string_view)> python_sink(const py::function& emit) {
  return [&emit](std::string_view piece) {
    py::gil_scoped_acquire acquire;
    emit(py::bytes(piece.data(), piece.size()));
  };
}

py::dict generate(const LoadedModel& m, const model::GenerateOptions& options, const py::function& emit) {
  model::GenerateStats stats;
  {
    py::gil_scoped_release release;
    const std::lock_guard lock(pool_mutex());
    stats = model::generate(*m.model, *m.tokenizer, options, default_pool(), python_sink(emit));
  }
  return stats_dict(stats);
}

// A reply to `history` (role/content pairs, the last one the user's) through a ChatSession: the model's own chat
// template, rendered without an added BOS, stopping at its end-of-turn tokens, as `lowbit chat` does.
// `template_source`, when given, replaces the model's template (as --chat-template does).
py::dict chat(const LoadedModel& m, const std::vector<std::pair<std::string, std::string>>& history,
              const std::optional<std::string>& template_source, const model::SamplerOptions& sampler,
              int64_t max_tokens, const py::function& emit) {
  if (history.empty() || history.back().first != "user")
    fail(Errc::usage, "[chat] the last message must be the user's");
  model::GenerateStats stats;
  {
    py::gil_scoped_release release;
    const std::lock_guard lock(pool_mutex());
    auto tmpl = template_source ? model::make_chat_template(*template_source, "chat_template", m.path, *m.tokenizer)
                                : model::chat_template_for(*m.model, m.path, *m.tokenizer);
    model::ChatSession session(*m.model, *m.tokenizer, std::move(tmpl), m.model->config.max_seq, sampler,
                               std::nullopt);
    for (size_t i = 0; i + 1 < history.size(); ++i) session.add_message({history[i].first, history[i].second});
    stats = session.reply(history.back().second, max_tokens, default_pool(), python_sink(emit));
  }
  return stats_dict(stats);
}

// As `lowbit eval`: the text tokenized once with BOS, BOS opening each window when the tokenizer adds one.
eval::WindowOptions window_options(const model::Tokenizer& tokenizer, int64_t ctx) {
  eval::WindowOptions w;
  const std::vector<int32_t> probe = tokenizer.encode("", true);
  if (!probe.empty() && probe.front() == tokenizer.bos_id()) w.bos = probe.front();
  w.ctx = ctx;
  return w;
}

std::vector<int32_t> tokenize_file(const model::Tokenizer& tokenizer, const std::filesystem::path& text_path) {
  const MappedFile file = MappedFile::open(text_path);
  return tokenizer.encode(std::string_view(reinterpret_cast<const char*>(file.bytes().data()), file.size()), true);
}

py::object eval_ppl(const std::filesystem::path& model_path, const std::filesystem::path& text_path, int64_t ctx,
                    const std::optional<std::filesystem::path>& tokenizer_file, const std::string& device) {
  nlohmann::json j;
  {
    py::gil_scoped_release release;
    const std::lock_guard lock(pool_mutex());
    const auto m = model::load_model(model_path, {.cpu_only = device == "cpu"});
    model::use_device(*m, device);
    const auto tokenizer = model::load_tokenizer(model_path, tokenizer_file);
    const auto tokens = tokenize_file(*tokenizer, text_path);
    const auto r = eval::perplexity(*m, tokens, window_options(*tokenizer, ctx), default_pool());
    j = {{"ppl", r.ppl}, {"ppl_stderr", r.ppl_stderr}, {"nll_mean", r.nll_mean},
         {"tokens", r.tokens}, {"windows", r.windows}, {"ctx", ctx}};
  }
  return to_python(j);
}

py::object eval_kld(const std::filesystem::path& base_path, const std::filesystem::path& other_path,
                    const std::filesystem::path& text_path, int64_t ctx,
                    const std::optional<std::filesystem::path>& tokenizer_file, const std::string& device) {
  nlohmann::json j;
  {
    py::gil_scoped_release release;
    const std::lock_guard lock(pool_mutex());
    const auto base = model::load_model(base_path, {.cpu_only = device == "cpu"});
    const auto other = model::load_model(other_path, {.cpu_only = device == "cpu"});
    model::use_device(*base, device);
    model::use_device(*other, device);
    const auto tokenizer = model::load_tokenizer(base_path, tokenizer_file);
    const auto tokens = tokenize_file(*tokenizer, text_path);
    const auto r = eval::kl_divergence(*base, *other, tokens, window_options(*tokenizer, ctx), default_pool());
    j = {{"kld_mean", r.kld_mean},         {"kld_stderr", r.kld_stderr},     {"kld_median", r.kld_median},
         {"kld_p99", r.kld_p99},           {"kld_max", r.kld_max},           {"top1_agreement", r.top1_agreement},
         {"delta_p_mean", r.delta_p_mean}, {"delta_p_stderr", r.delta_p_stderr},
         {"ppl_base", r.base.ppl},         {"ppl_other", r.other.ppl},       {"tokens", r.tokens},
         {"ctx", ctx}};
  }
  return to_python(j);
}

py::object quantize(const std::filesystem::path& source, const std::filesystem::path& destination,
                    const std::string& preset, const std::optional<std::filesystem::path>& calibration, bool force,
                    uint64_t seed) {
  nlohmann::json j;
  {
    py::gil_scoped_release release;
    const std::lock_guard lock(pool_mutex());
    quant::QuantizeOptions o;
    o.source = source;
    o.destination = destination;
    o.recipe = quant::preset(preset);
    o.calibration = calibration;
    o.force = force;
    o.seed = seed;
    j = quant::quantize(o).to_json();
  }
  return to_python(j);
}

py::object verify(const std::filesystem::path& path, bool verify_hash) {
  nlohmann::json j;
  {
    py::gil_scoped_release release;
    const auto a = artifact::Artifact::open(path, {.verify_hash = verify_hash});
    j = {{"tensors", a.manifest().tensors.size()}, {"files", a.manifest().files.size() + 1},
         {"bytes", a.total_bytes()}};
  }
  return to_python(j);
}

py::object inspect(const std::filesystem::path& path, bool verify_hash) {
  nlohmann::json j;
  {
    py::gil_scoped_release release;
    j = artifact::inspect_json(path, verify_hash);
  }
  return to_python(j);
}

}  // namespace

PYBIND11_MODULE(_lowbit, m) {
  m.doc() = "lowbit's C++ library (use the lowbit package, not this module)";
  // lowbit.Error and its subclasses are Python classes (lowbit/__init__.py); this hook raises them.
  // Never destroyed: a py::object released after the interpreter has finalized would crash at exit.
  static auto* raise_error = new py::object();
  m.def("_set_error_hook", [](py::object hook) { *raise_error = std::move(hook); });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      if (!*raise_error) throw;
      try {
        (*raise_error)(std::string(errc_name(e.code())), exit_code(e.code()), e.what());  // always raises
      } catch (py::error_already_set& raised) {
        raised.restore();  // the lowbit.Error it raised becomes the pending Python exception
      }
    }
  });

  py::class_<model::SamplerOptions>(m, "SamplerOptions")
      .def(py::init<>())
      .def_readwrite("temperature", &model::SamplerOptions::temperature)
      .def_readwrite("top_k", &model::SamplerOptions::top_k)
      .def_readwrite("top_p", &model::SamplerOptions::top_p)
      .def_readwrite("min_p", &model::SamplerOptions::min_p)
      .def_readwrite("repeat_penalty", &model::SamplerOptions::repeat_penalty)
      .def_readwrite("repeat_last_n", &model::SamplerOptions::repeat_last_n)
      .def_readwrite("seed", &model::SamplerOptions::seed);
  py::class_<model::GenerateOptions>(m, "GenerateOptions")
      .def(py::init<>())
      .def_readwrite("prompt", &model::GenerateOptions::prompt)
      .def_readwrite("steps", &model::GenerateOptions::steps)
      .def_readwrite("sampler", &model::GenerateOptions::sampler)
      .def_readwrite("echo_prompt", &model::GenerateOptions::echo_prompt);
  py::class_<LoadedModel, std::shared_ptr<LoadedModel>>(m, "LoadedModel")
      .def_property_readonly("path", [](const LoadedModel& lm) { return lm.path; });

  m.def("load", &load, py::arg("path"), py::arg("tokenizer"), py::arg("device"));
  m.def("generate", &generate);
  m.def("chat", &chat);
  m.def("eval_ppl", &eval_ppl);
  m.def("eval_kld", &eval_kld);
  m.def("quantize", &quantize);
  m.def("verify", &verify);
  m.def("inspect", &inspect);
  m.def("set_threads", [](size_t n) { set_default_threads(n); });
}
