// lowbit serve: an OpenAI-compatible HTTP server (cpp-httplib) over the model engine's continuous batching
// (lowbit/model/engine.h). POST /v1/chat/completions and /v1/completions (streamed as server-sent events or
// whole with usage), GET /v1/models, /health, /metrics (Prometheus text). Every bad request gets OpenAI's error
// object; the server keeps running. SIGINT/SIGTERM end the requests in flight and stop it. Logs go to stderr.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <pthread.h>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <thread>

#include "command.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/engine.h"

namespace {

using json = nlohmann::ordered_json;  // the same type as jinja::Json; keeps fields in the order written
using lowbit::model::FinishReason;

struct Args {
  std::string model;
  std::optional<std::string> tokenizer, chat_template, api_key;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string device = "cpu";
  std::string devices;
  int parallel = 4;
  int64_t context = 2048;
  size_t max_queue = 64;
  size_t max_body = 1 << 20;
  int64_t max_tokens_limit = 0;
  size_t max_connections = 64;
  size_t threads = 0;
};

// A request the server refuses: OpenAI's error object with its HTTP status.
struct ApiError {
  int status;
  std::string message;
  std::string type;
  std::optional<std::string> param, code;
};

ApiError api_error(int status, std::string message, std::optional<std::string> code = std::nullopt) {
  return {status, std::move(message), status >= 500 ? "server_error" : "invalid_request_error", std::nullopt,
          std::move(code)};
}


[[noreturn]] void refuse(std::string message, std::optional<std::string> param = std::nullopt,
                         std::optional<std::string> code = std::nullopt, int status = 400) {
  ApiError e = api_error(status, std::move(message), std::move(code));
  e.param = std::move(param);
  throw e;
}

// Invalid UTF-8 from a model (a token cut inside a character) becomes U+FFFD instead of failing the response.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param ? json(*e.param) : json(nullptr)},
            {"code", e.code ? json(*e.code) : json(nullptr)}}}};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_body(e)), "application/json");
}

// The chat prompt of OpenAI-style messages (content parts, tool calls, tool results) and tool definitions (an
// array, or null), rendered by the model's own Jinja template.
std::string format_chat(const lowbit::model::ChatTemplate& tmpl, const json& messages, const json& tools) {
  return lowbit::model::render_chat(tmpl, messages, tools, true);
}

// Typed field access that names the field in the error.
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}
double number_field(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) refuse(fmt::format("'{}' must be a number", name), name);
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) refuse(fmt::format("'{}' is {}; expected {}..{}", name, x, lo, hi), name);
  return x;
}
int64_t integer_field(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) refuse(fmt::format("'{}' must be an integer", name), name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    refuse(fmt::format("'{}' is {}; expected {}..{}", name, v->get<uint64_t>(), lo, hi), name);
  const auto x = v->get<int64_t>();
  if (x < lo || x > hi) refuse(fmt::format("'{}' is {}; expected {}..{}", name, x, lo, hi), name);
  return x;
}
bool bool_field(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) refuse(fmt::format("'{}' must be a boolean", name), name);
  return v->get<bool>();
}
std::string string_field(const json& v, const char* name) {
  if (!v.is_string()) refuse(fmt::format("'{}' must be a string", name), name);
  return v.get<std::string>();
}

enum class Endpoint { chat, completion };

class Server {
 public:
  Server(const Args& args, const lowbit::model::Model& model, const lowbit::model::Tokenizer& tokenizer,
         std::optional<lowbit::model::ChatTemplate> chat_template, lowbit::model::Engine& engine)
      : args_(args),
        model_(model),
        tokenizer_(tokenizer),
        chat_template_(std::move(chat_template)),
        engine_(engine),
        model_id_(std::filesystem::path(args.model).filename().string()),
        max_tokens_limit_(args.max_tokens_limit > 0 ? args.max_tokens_limit : engine.context()) {
    eos_ = tokenizer.eos_ids();
    eos_.insert(eos_.end(), model.config.eos_ids.begin(), model.config.eos_ids.end());
    chat_stops_ = lowbit::model::chat_stop_tokens(model, tokenizer);
    if (model_id_.empty()) model_id_ = args.model;
    std::random_device rd;
    id_prefix_ = fmt::format("{:08x}", rd());
  }

  void install(httplib::Server& http) {
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, Endpoint::chat); });
    http.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, Endpoint::completion); });
    http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      res.set_content(dump({{"object", "list"},
                            {"data", json::array({{{"id", model_id_},
                                                   {"object", "model"},
                                                   {"created", started_},
                                                   {"owned_by", "lowbit"}}})}}),
                      "application/json");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    // Responses httplib itself produces (unknown path 404, body too large 413, unparsable request 400) carry
    // an OpenAI error object too.
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string what = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                               : res.status == 413 ? std::string("the request body is larger than --max-body")
                                                   : fmt::format("HTTP {}", res.status);
      send_error(res, api_error(res.status, what,
                                res.status == 404   ? "not_found"
                                : res.status == 413 ? "request_too_large"
                                                    : "invalid_request"));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(std::move(ep));
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "[serve] handler failed: %s\n", what.c_str());
      send_error(res, api_error(500, what));
    });
    http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      std::fprintf(stderr, "[serve] %s %s %s -> %d\n", req.remote_addr.c_str(), req.method.c_str(), req.path.c_str(),
                   res.status);
    });
  }

 private:
  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (!args_.api_key) return true;
    if (req.get_header_value("Authorization") == "Bearer " + *args_.api_key) return true;
    ++errors_;
    send_error(res, api_error(401, "invalid API key (send 'Authorization: Bearer KEY')", "invalid_api_key"));
    return false;
  }

  struct Parsed {
    lowbit::model::GenerationRequest request;
    bool stream = false, include_usage = false, logprobs = false;
    bool tools = false;  // tool definitions given: replies are parsed for tool calls
  };

  Parsed parse(const json& body, Endpoint endpoint) const {
    if (!body.is_object()) refuse("the request body must be a JSON object");
    const json* model = field(body, "model");
    if (!model) refuse("'model' is required", "model");
    if (string_field(*model, "model") != model_id_)
      refuse(fmt::format("the model '{}' does not exist; this server serves '{}'", model->get<std::string>(), model_id_),
             "model", "model_not_found", 404);
    if (integer_field(body, "n", 1, 1, 128) != 1) refuse("only n = 1 is supported", "n");
    if (const json* format = field(body, "response_format")) {
      const json* type = format->is_object() ? field(*format, "type") : nullptr;
      if (!type || !type->is_string()) refuse("'response_format' must be an object with a string 'type'", "response_format");
      if (*type != "text")
        refuse(fmt::format("response_format '{}' is not implemented (no constrained decoding yet); use 'text'",
                           type->get<std::string>()),
               "response_format");
    }

    Parsed p;
    auto& r = p.request;
    std::string prompt;
    if (endpoint == Endpoint::chat) {
      if (!chat_template_)
        refuse("this model has no chat template lowbit can run; start the server with --chat-template, or use "
               "/v1/completions",
               "messages");
      const json* messages = field(body, "messages");
      if (!messages || !messages->is_array() || messages->empty())
        refuse("'messages' must be a non-empty array", "messages");
      json conversation = *messages;
      for (auto& m : conversation) {
        const json* role = m.is_object() ? field(m, "role") : nullptr;
        if (!role || !role->is_string()) refuse("each message must be an object with a string 'role'", "messages");
        static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
        if (!kRoles.contains(role->get<std::string>()))
          refuse(fmt::format("message role '{}' is not one of system, developer, user, assistant, tool",
                             role->get<std::string>()),
                 "messages");
        if (*role == "developer") m["role"] = "system";  // OpenAI's newer name; chat templates know "system"
        const json* content = field(m, "content");
        if (content && !content->is_string() && !content->is_array())
          refuse("a message's 'content' must be a string, an array of content parts or null", "messages");
        if (!content && !field(m, "tool_calls"))
          refuse("a message needs 'content' (or 'tool_calls')", "messages");
      }
      const json* tools = field(body, "tools");
      if (tools && !tools->is_array()) refuse("'tools' must be an array", "tools");
      p.tools = tools && !tools->empty();
      try {
        prompt = format_chat(*chat_template_, conversation, tools ? *tools : json(nullptr));
      } catch (const lowbit::Error& e) {  // the template refused the conversation (raise_exception) or failed
        refuse(fmt::format("the chat template cannot render these messages: {}", e.what()), "messages");
      }
      r.prompt = tokenizer_.encode(prompt, false, true);
      r.stop_tokens = chat_stops_;
      const int64_t fallback = max_tokens_limit_;
      r.max_tokens = integer_field(body, "max_completion_tokens", fallback, 1, max_tokens_limit_);
      r.max_tokens = integer_field(body, "max_tokens", r.max_tokens, 1, max_tokens_limit_);
      p.logprobs = bool_field(body, "logprobs", false);
      const int64_t top = integer_field(body, "top_logprobs", 0, 0, 20);
      if (field(body, "top_logprobs") && !p.logprobs) refuse("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      r.top_logprobs = p.logprobs ? static_cast<int>(top) : -1;
    } else {
      const json* pr = field(body, "prompt");
      if (!pr) refuse("'prompt' is required", "prompt");
      if (pr->is_array()) {
        if (pr->size() != 1) refuse("'prompt' as an array must hold exactly one string (n = 1)", "prompt");
        prompt = string_field((*pr)[0], "prompt");
      } else {
        prompt = string_field(*pr, "prompt");
      }
      r.prompt = tokenizer_.encode(prompt, true, true);
      r.stop_tokens = eos_;
      r.max_tokens = integer_field(body, "max_tokens", std::min<int64_t>(16, max_tokens_limit_), 1, max_tokens_limit_);
      const int64_t top = integer_field(body, "logprobs", -1, 0, 5);  // the legacy API: an integer 0..5
      p.logprobs = top >= 0;
      r.top_logprobs = static_cast<int>(top);
    }
    if (r.prompt.empty()) refuse("the prompt is empty (and the tokenizer has no BOS token)", "prompt");
    if (static_cast<int64_t>(r.prompt.size()) >= engine_.context())
      refuse(fmt::format("the prompt has {} tokens; the context holds {} (prompt and completion, --ctx)", r.prompt.size(),
                         engine_.context()),
             endpoint == Endpoint::chat ? "messages" : "prompt", "context_length_exceeded");

    auto& s = r.sampler;
    s.temperature = static_cast<float>(number_field(body, "temperature", 1.0, 0.0, 2.0));
    s.top_p = static_cast<float>(number_field(body, "top_p", 1.0, 0.0, 1.0));
    s.top_k = static_cast<int32_t>(integer_field(body, "top_k", 0, 0, model_.config.vocab));
    s.min_p = static_cast<float>(number_field(body, "min_p", 0.0, 0.0, 1.0));
    s.repeat_penalty = 1.0f;
    if (const json* seed = field(body, "seed")) {
      if (!seed->is_number_integer()) refuse("'seed' must be an integer", "seed");
      s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
    } else {
      s.seed = std::random_device{}();
    }
    if (const json* stop = field(body, "stop")) {
      if (stop->is_string()) {
        r.stop.push_back(stop->get<std::string>());
      } else if (stop->is_array() && stop->size() <= 16) {
        for (const auto& x : *stop) r.stop.push_back(string_field(x, "stop"));
      } else {
        refuse("'stop' must be a string or an array of at most 16 strings", "stop");
      }
      for (const auto& x : r.stop)
        if (x.empty()) refuse("'stop' strings must not be empty", "stop");
    }
    p.stream = bool_field(body, "stream", false);
    if (const json* options = field(body, "stream_options")) {
      if (!options->is_object()) refuse("'stream_options' must be an object", "stream_options");
      p.include_usage = bool_field(*options, "include_usage", false);
    }
    return p;
  }

  void complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    if (!authorized(req, res)) return;
    try {
      json body;
      try {
        body = json::parse(req.body);
      } catch (const json::exception& e) {
        refuse(fmt::format("the body is not valid JSON: {}", e.what()));
      }
      Parsed parsed = parse(body, endpoint);
      std::shared_ptr<lowbit::model::GenerationStream> stream;
      try {
        stream = engine_.submit(std::move(parsed.request));
      } catch (const lowbit::Error& e) {
        refuse(e.what());
      }
      if (!stream) refuse("the server is busy (its queue is full); retry later", std::nullopt, "server_busy", 503);
      const Response shape{endpoint, fmt::format("{}-{}{}", endpoint == Endpoint::chat ? "chatcmpl" : "cmpl", id_prefix_,
                                                 ++next_id_),
                           static_cast<int64_t>(std::time(nullptr)), parsed.logprobs, parsed.tools};
      if (parsed.stream)
        stream_response(res, stream, shape, parsed.include_usage);
      else
        whole_response(res, stream, shape);
    } catch (const ApiError& e) {
      ++errors_;
      send_error(res, e);
    }
  }

  struct Response {
    Endpoint endpoint;
    std::string id;
    int64_t created;
    bool logprobs;
    bool tools;  // parse the reply for tool calls
  };

  // A chat reply as OpenAI's message fields: content, and tool_calls when tools were given and the model wrote
  // calls in a format the template family defines (parse_tool_calls: Qwen/Hermes <tool_call> JSON).
  json reply_fields(const Response& shape, const std::string& text, bool streamed) const {
    if (!shape.tools) return {{"content", text}};
    auto parsed = lowbit::model::parse_tool_calls(text);
    if (parsed.tool_calls.empty()) return {{"content", text}};
    json calls = json::array();
    for (size_t k = 0; k < parsed.tool_calls.size(); ++k) {
      json call = {{"id", fmt::format("call_{}_{}", shape.id, k)},
                   {"type", "function"},
                   {"function", {{"name", parsed.tool_calls[k].name}, {"arguments", dump(parsed.tool_calls[k].arguments)}}}};
      if (streamed) call["index"] = k;
      calls.push_back(std::move(call));
    }
    return {{"content", parsed.content.empty() ? json(nullptr) : json(parsed.content)}, {"tool_calls", std::move(calls)}};
  }

  // "tool_calls" when the reply became tool calls, else the engine's reason.
  static std::string finish_name(const json& fields, FinishReason reason) {
    return fields.contains("tool_calls") && reason == FinishReason::stop ? "tool_calls" : finish_reason_name(reason);
  }

  json chat_logprobs(const std::vector<lowbit::model::TokenLogprob>& tokens) const {
    auto entry = [&](int32_t id, float logprob) {
      const std::string text = tokenizer_.token_text(id);
      return json{{"token", text}, {"logprob", logprob}, {"bytes", std::vector<int>(text.begin(), text.end())}};
    };
    json content = json::array();
    for (const auto& t : tokens) {
      json e = entry(t.token, t.logprob);
      e["top_logprobs"] = json::array();
      for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(id, lp));
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }

  // The legacy completions logprobs object; text_offset counts from `offset` bytes into the completion.
  json completion_logprobs(const std::vector<lowbit::model::TokenLogprob>& tokens, size_t offset) const {
    json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (const auto& t : tokens) {
      const std::string text = tokenizer_.token_text(t.token);
      out["tokens"].push_back(text);
      out["token_logprobs"].push_back(t.logprob);
      json top = json::object();
      for (const auto& [id, lp] : t.top) top[tokenizer_.token_text(id)] = lp;
      out["top_logprobs"].push_back(std::move(top));
      out["text_offset"].push_back(offset);
      offset += text.size();
    }
    return out;
  }

  json logprobs_json(const Response& shape, const std::vector<lowbit::model::TokenLogprob>& tokens, size_t offset) const {
    if (!shape.logprobs) return nullptr;
    return shape.endpoint == Endpoint::chat ? chat_logprobs(tokens) : completion_logprobs(tokens, offset);
  }

  static json usage(const lowbit::model::GenerationEvent& last) {
    return {{"prompt_tokens", last.prompt_tokens},
            {"completion_tokens", last.completion_tokens},
            {"total_tokens", last.prompt_tokens + last.completion_tokens}};
  }

  static void refuse_failed(const lowbit::model::GenerationEvent& last) {
    if (last.finish == FinishReason::error) refuse("generation failed: " + last.error, std::nullopt, "server_error", 500);
    if (last.finish == FinishReason::cancelled) refuse("the server is stopping", std::nullopt, "server_stopping", 503);
  }

  static void merge(lowbit::model::GenerationEvent& all, lowbit::model::GenerationEvent&& event) {
    all.text += event.text;
    all.tokens.insert(all.tokens.end(), event.tokens.begin(), event.tokens.end());
    all.finish = event.finish;
    all.prompt_tokens = event.prompt_tokens;
    all.completion_tokens = event.completion_tokens;
    all.error = std::move(event.error);
  }

  json whole_body(const Response& shape, const lowbit::model::GenerationEvent& all) const {
    json choice = {{"index", 0}};
    if (shape.endpoint == Endpoint::chat) {
      json message = {{"role", "assistant"}};
      json fields = reply_fields(shape, all.text, false);
      choice["finish_reason"] = finish_name(fields, all.finish);
      message.update(fields);
      choice["message"] = std::move(message);
    } else {
      choice["text"] = all.text;
      choice["finish_reason"] = finish_reason_name(all.finish);
    }
    choice["logprobs"] = logprobs_json(shape, all.tokens, 0);
    return {{"id", shape.id},
            {"object", shape.endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
            {"created", shape.created},
            {"model", model_id_},
            {"choices", json::array({std::move(choice)})},
            {"usage", usage(all)}};
  }

  // A whole (non-streamed) response. The first event settles the status (the prompt is prefilled, or the request
  // failed); a generation still running then goes on as a chunked body that begins with JSON whitespace, a space
  // per event or idle second, so that a client that left fails a write and frees its slot as a stream does.
  void whole_response(httplib::Response& res, const std::shared_ptr<lowbit::model::GenerationStream>& stream,
                      const Response& shape) {
    auto all = std::make_shared<lowbit::model::GenerationEvent>();
    lowbit::model::GenerationEvent event;
    while (!stream->next(event, std::chrono::seconds(1))) {
    }
    merge(*all, std::move(event));
    if (all->finish != FinishReason::none) {
      refuse_failed(*all);
      res.set_content(dump(whole_body(shape, *all)), "application/json");
      return;
    }
    res.set_chunked_content_provider(
        "application/json",
        [this, stream, shape, all](size_t, httplib::DataSink& sink) {
          lowbit::model::GenerationEvent e;
          if (stream->next(e, std::chrono::seconds(1))) merge(*all, std::move(e));
          if (all->finish == FinishReason::none) return sink.write(" ", 1);
          // The status went out already: a failed generation becomes the error object of the body.
          const std::string body =
              all->finish == FinishReason::error       ? dump(error_body(api_error(500, "generation failed: " + all->error)))
              : all->finish == FinishReason::cancelled ? dump(error_body(api_error(503, "the server is stopping", "server_stopping")))
                                                       : dump(whole_body(shape, *all));
          if (!sink.write(body.data(), body.size())) return false;
          sink.done();
          return true;
        },
        [stream](bool) { stream->cancel(); });
  }

  json chunk(const Response& shape, json choice) const {
    return {{"id", shape.id},
            {"object", shape.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", shape.created},
            {"model", model_id_},
            {"choices", json::array({std::move(choice)})}};
  }

  json delta_choice(const Response& shape, const std::string& text, json logprobs, json finish) const {
    // The first chat chunk (no text, no finish) announces the role; the last has an empty delta.
    const bool opening = text.empty() && finish.is_null();
    json choice = {{"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
    if (shape.endpoint == Endpoint::chat)
      choice["delta"] = opening        ? json{{"role", "assistant"}, {"content", ""}}
                        : text.empty() ? json::object()
                                       : json{{"content", text}};
    else
      choice["text"] = text;
    return choice;
  }

  void stream_response(httplib::Response& res, const std::shared_ptr<lowbit::model::GenerationStream>& stream,
                       const Response& shape, bool include_usage) {
    struct State {
      bool started = false;
      size_t offset = 0;  // completion bytes sent, for text_offset
      lowbit::model::GenerationEvent held;  // with tools: the reply so far, sent whole once parsed
    };
    auto state = std::make_shared<State>();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, stream, shape, include_usage, state](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string line = "data: " + dump(j) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          if (!state->started && shape.endpoint == Endpoint::chat) {
            state->started = true;
            return send(chunk(shape, delta_choice(shape, "", nullptr, nullptr)));
          }
          state->started = true;
          lowbit::model::GenerationEvent event;
          if (!stream->next(event, std::chrono::seconds(1))) {
            // An SSE comment while waiting (queued, or a long prefill): a client that left fails this write.
            static constexpr std::string_view kWaiting = ": waiting\n\n";
            return sink.write(kWaiting.data(), kWaiting.size());
          }
          if (event.finish == FinishReason::error || event.finish == FinishReason::cancelled) {
            const ApiError e = event.finish == FinishReason::cancelled
                                   ? api_error(503, "the server is stopping", "server_stopping")
                                   : api_error(500, "generation failed: " + event.error, "server_error");
            const std::string line = "data: " + dump(error_body(e)) + "\n\ndata: [DONE]\n\n";
            sink.write(line.data(), line.size());
            sink.done();
            return true;
          }
          json finish = event.finish == FinishReason::none ? json(nullptr) : json(finish_reason_name(event.finish));
          const bool has_content = !event.text.empty() || (shape.logprobs && !event.tokens.empty());
          if (shape.tools) {
            // Tool calls are parsed from the whole reply: it is held back and sent as one delta at the end (an SSE
            // comment per event meanwhile notices a client that left).
            merge(state->held, std::move(event));
            if (state->held.finish == FinishReason::none) {
              static constexpr std::string_view kGenerating = ": generating\n\n";
              return sink.write(kGenerating.data(), kGenerating.size());
            }
            event = state->held;
            const json fields = reply_fields(shape, event.text, true);
            json choice = {{"index", 0}, {"delta", fields}, {"logprobs", logprobs_json(shape, event.tokens, 0)},
                           {"finish_reason", nullptr}};
            if (!send(chunk(shape, std::move(choice)))) return false;
            if (!send(chunk(shape, delta_choice(shape, "", nullptr, finish_name(fields, event.finish))))) return false;
          } else if (has_content || !finish.is_null()) {
            json logprobs = logprobs_json(shape, event.tokens, state->offset);
            state->offset += event.text.size();
            if (shape.endpoint == Endpoint::chat && !finish.is_null() && has_content) {
              // The text first, then a chunk with the finish reason and an empty delta, as OpenAI sends them.
              if (!send(chunk(shape, delta_choice(shape, event.text, std::move(logprobs), nullptr)))) return false;
              if (!send(chunk(shape, delta_choice(shape, "", nullptr, finish)))) return false;
            } else if (!send(chunk(shape, delta_choice(shape, event.text, std::move(logprobs), finish)))) {
              return false;
            }
          }
          if (event.finish == FinishReason::none) return true;
          if (include_usage) {
            json last = chunk(shape, nullptr);
            last["choices"] = json::array();
            last["usage"] = usage(event);
            if (!send(last)) return false;
          }
          static constexpr std::string_view kDone = "data: [DONE]\n\n";
          if (!sink.write(kDone.data(), kDone.size())) return false;
          sink.done();
          return true;
        },
        // Always called when the response ends; a client that left mid-stream frees its slot here.
        [stream](bool) { stream->cancel(); });
  }

  std::string metrics_text() const {
    const auto m = engine_.metrics();
    std::ostringstream out;
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
      out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << value << '\n';
    };
    metric("lowbit_requests_total", "counter", "Generation requests accepted.", m.requests);
    metric("lowbit_requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.",
           m.rejected);
    metric("lowbit_request_errors_total", "counter", "Requests refused as invalid (4xx).", errors_.load());
    metric("lowbit_prompt_tokens_total", "counter", "Prompt tokens prefilled.", m.prompt_tokens);
    metric("lowbit_generated_tokens_total", "counter", "Tokens sampled.", m.generated_tokens);
    metric("lowbit_engine_steps_total", "counter", "Engine steps (one prefill pass and one decode token each).", m.steps);
    metric("lowbit_queue_length", "gauge", "Requests waiting for a slot.", m.queued);
    metric("lowbit_batch_size", "gauge", "Sequences holding a slot.", m.active);
    metric("lowbit_slots", "gauge", "KV slots (--parallel).", engine_.options().parallel);
    metric("lowbit_decode_tokens_per_second", "gauge", "Tokens sampled per second of step time, smoothed.",
           m.decode_tokens_per_second);
    return out.str();
  }

  const Args& args_;
  const lowbit::model::Model& model_;
  const lowbit::model::Tokenizer& tokenizer_;
  std::optional<lowbit::model::ChatTemplate> chat_template_;
  lowbit::model::Engine& engine_;
  std::string model_id_;
  int64_t max_tokens_limit_;
  std::vector<int32_t> eos_, chat_stops_;
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{0}, errors_{0};
  int64_t started_ = static_cast<int64_t>(std::time(nullptr));
};

// The chat template: --chat-template FILE, else the model's own (or a built-in one its tokenizer fits); none is
// not fatal (only /v1/chat/completions needs one).
std::optional<lowbit::model::ChatTemplate> load_chat_template(const Args& a, const lowbit::model::Model& model,
                                                              const lowbit::model::Tokenizer& tokenizer) {
  using namespace lowbit;
  if (a.chat_template) return model::chat_template_from_file(*a.chat_template, a.model, tokenizer);
  try {
    return model::chat_template_for(model, a.model, tokenizer);
  } catch (const Error& e) {
    if (e.code() != Errc::unsupported) throw;
    std::fprintf(stderr, "[serve] %s; /v1/chat/completions answers 400\n", e.what());
    return std::nullopt;
  }
}

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }

void run(const Args& a) {
  using namespace lowbit;
  if (a.port < 0 || a.port > 65535) fail(Errc::usage, "[serve] --port {}: expected 0..65535", a.port);
  // SIGINT and SIGTERM go to the thread that waits for them (every thread started below inherits the mask);
  // SIGPIPE from a client that left is ignored (the failed write ends that response).
  // Threads that libraries start before main (OpenBLAS's pool) do not have the mask, and a signal they take would
  // end the process by the default action: the handler records it instead, and the waiter below reads it.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGINT, record_stop_signal);
  std::signal(SIGTERM, record_stop_signal);
  std::signal(SIGPIPE, SIG_IGN);

  set_default_threads(a.threads);
  const std::vector<int> devices = lowbit::cli::devices_of(a.devices);
  const auto model = model::load_model(a.model, {.max_seq = a.context, .cpu_only = a.device == "cpu"});
  const auto tokenizer = model::load_tokenizer(a.model, a.tokenizer);
  auto chat_template = load_chat_template(a, *model, *tokenizer);
  model::EngineOptions engine_options;
  engine_options.device = a.device;
  engine_options.devices = devices;
  engine_options.parallel = a.parallel;
  engine_options.context = a.context;
  engine_options.max_queue = a.max_queue;
  model::Engine engine(*model, *tokenizer, engine_options, default_pool());
  Server server(a, *model, *tokenizer, std::move(chat_template), engine);

  httplib::Server http;
  const size_t connections = a.max_connections;
  http.new_task_queue = [connections] { return new httplib::ThreadPool(connections); };
  http.set_payload_max_length(a.max_body);
  // SO_REUSEADDR alone: a restart binds through TIME_WAIT, but a port another server holds fails to bind
  // (httplib's default, SO_REUSEPORT, would let a second server share it silently).
  http.set_socket_options([](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.set_read_timeout(std::chrono::seconds(30));
  server.install(http);
  int port = a.port;
  if (port == 0) {
    port = http.bind_to_any_port(a.host);
    if (port < 0) fail(Errc::io, "[serve] cannot listen on {} (any port)", a.host);
  } else if (!http.bind_to_port(a.host, port)) {
    fail(Errc::io, "[serve] cannot listen on {}:{}", a.host, port);
  }
  engine.start();
  std::fprintf(stderr, "[serve] %s on %s, %d slots of %lld positions, listening on http://%s:%d\n", a.model.c_str(),
               a.device.c_str(), a.parallel, static_cast<long long>(engine.context()), a.host.c_str(), port);

  std::atomic<bool> listening_done{false};
  std::thread waiter([&] {
    const timespec tick{0, 200'000'000};
    while (!listening_done) {
      int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig != SIGINT && sig != SIGTERM) sig = g_stop_signal;
      if (sig != SIGINT && sig != SIGTERM) continue;
      std::fprintf(stderr, "[serve] %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      engine.stop();  // ends the responses in flight first: httplib's stop joins its handler threads
      http.stop();
      return;
    }
  });
  const bool ok = http.listen_after_bind();
  listening_done = true;
  waiter.join();
  engine.stop();
  if (!ok) fail(Errc::io, "[serve] the server on {}:{} failed", a.host, port);
  std::fprintf(stderr, "[serve] stopped\n");
}

void setup(CLI::App& root) {
  auto args = std::make_shared<Args>();
  auto* cmd = root.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->add_option("model", args->model, "Model: GGUF file, HF directory, lowbit artifact, llama2.c .bin")->required();
  cmd->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "Port (0: any free port, printed on stderr)")->capture_default_str();
  cmd->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  lowbit::cli::add_devices_option(cmd, args->devices);
  cmd->add_option("--parallel", args->parallel, "Sequences decoded together, each in its own KV slot (cuda: 1..16)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--ctx", args->context, "Positions per slot, prompt and completion")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--chat-template", args->chat_template,
                  "Jinja chat template file (default: the model's own)");
  cmd->add_option("--tokenizer", args->tokenizer, "Tokenizer file when not beside the model");
  cmd->add_option("--max-queue", args->max_queue, "Requests waiting for a slot; more get 503")->capture_default_str();
  cmd->add_option("--max-body", args->max_body, "Largest request body in bytes (413 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-tokens-limit", args->max_tokens_limit, "Largest max_tokens a request may ask (default: --ctx)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-connections", args->max_connections,
                  "Connections served at once (HTTP threads; a streaming response holds one)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (default: all cores)");
  cmd->callback([args] { run(*args); });
}

}  // namespace

LOWBIT_COMMAND(serve, setup);
