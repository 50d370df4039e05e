// The server's models and their routing, the HTTP life cycle, and the reports that
// cover every model (see server.h).
#include "server.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "clock.h"
#include "grpc_call.h"
#include "listener.h"
#include "metadata.h"
#include "protobuf.h"
#include "text.h"

namespace asio = boost::asio;

namespace paddle_ipu {
namespace serving {

namespace {

bool Digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Versions in order: numbers as numbers (2 < 10), others as text after them.
bool VersionLess(std::string_view a, std::string_view b) {
  const bool da = Digits(a), db = Digits(b);
  if (da != db) return da;
  if (da) {
    const size_t za = std::min(a.find_first_not_of('0'), a.size());
    const size_t zb = std::min(b.find_first_not_of('0'), b.size());
    a.remove_prefix(za), b.remove_prefix(zb);
    if (a.size() != b.size()) return a.size() < b.size();
  }
  return a < b;
}

bool EntryLess(const ModelEntry& a, const ModelEntry& b) {
  if (a.name != b.name) return a.name < b.name;
  return VersionLess(a.version, b.version);
}

std::string Joined(const std::vector<std::string>& items, std::string (*q)(std::string_view)) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + q(items[i]);
  return s;
}

// The entries of a {"model_stats":[...]} document.
std::string_view StatsEntries(std::string_view doc) {
  constexpr std::string_view kHead = "{\"model_stats\":[";
  if (doc.substr(0, kHead.size()) != kHead || doc.size() < kHead.size() + 2) return {};
  return doc.substr(kHead.size(), doc.size() - kHead.size() - 2);
}

// Prometheus texts of several models as one: each metric family once (its HELP and
// TYPE lines), with the samples of every model under it.
std::string MergePrometheus(const std::vector<std::string>& texts) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::string, std::string>> families;  // head, samples
  for (size_t t = 0; t < texts.size(); ++t) {
    std::set<std::string> heads_here;
    std::string current;
    std::string_view rest(texts[t]);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view line = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
      if (line.empty()) continue;
      if (line.substr(0, 2) == "# ") {
        // "# HELP name ..." / "# TYPE name ..."
        const size_t a = line.find(' ', 2);
        const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
        current = std::string(a == std::string_view::npos ? line : line.substr(a + 1, b - a - 1));
        auto [it, added] = families.try_emplace(current);
        if (added) order.push_back(current), heads_here.insert(current);
        if (heads_here.count(current)) it->second.first += std::string(line) + "\n";
        continue;
      }
      auto [it, added] = families.try_emplace(current);
      if (added) order.push_back(current);
      it->second.second += std::string(line) + "\n";
    }
  }
  std::string out;
  for (const std::string& name : order) out += families[name].first + families[name].second;
  return out;
}

// An IO thread: its io_context's handlers until it is stopped. A handler that throws
// (a request's handling has its own guard: this is what is outside any) loses what it
// was doing, which is logged, and the thread goes on with the others.
void RunIo(asio::io_context& ioc, Server* srv) {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      srv->CountIoFailure();
      std::fprintf(stderr, "paddle-ipu: an IO thread's handler failed (serving goes on): %s\n",
                   e.what());
    } catch (...) {
      srv->CountIoFailure();
      std::fprintf(stderr, "paddle-ipu: an IO thread's handler failed (serving goes on)\n");
    }
  }
}

}  // namespace

Server::Server(std::string server_version, ServerLimits limits)
    : limits_(limits), unrouted_(std::make_shared<Counters>()) {
  server_version_ = std::move(server_version);
  server_metadata_ = ServerMetadataJson(server_version_);
}

Server::~Server() {
  CloseControl();
  Shutdown();
}

bool Server::ready() const {
  if (!ready_.load() || draining_.load()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (const ModelEntry& e : entries_) {
    if (e.state == "READY" && !e.fe->ready()) return false;
  }
  return true;
}

std::vector<ModelEntry>::iterator Server::Locate(const std::string& name,
                                                 const std::string& version) {
  return std::find_if(entries_.begin(), entries_.end(), [&](const ModelEntry& e) {
    return e.name == name && e.version == version;
  });
}

void Server::OpenAccessLog(const std::string& path) {
  if (!listeners_.empty()) throw std::runtime_error("open the access log before starting");
  log_ = std::make_shared<AccessLog>(path);
  unrouted_->set_log(log_);
  std::lock_guard<std::mutex> lock(mu_);
  for (ModelEntry& e : entries_) {
    if (e.fe) e.fe->counters()->set_log(log_);
  }
}

void Server::AddModel(std::shared_ptr<FrontEnd> fe) {
  if (log_) fe->counters()->set_log(log_);
  ModelEntry e{fe->plan().name, fe->plan().version, "READY", "", std::move(fe)};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = Locate(e.name, e.version);
  if (it != entries_.end()) {
    *it = std::move(e);
  } else {
    entries_.insert(std::upper_bound(entries_.begin(), entries_.end(), e, EntryLess), std::move(e));
  }
}

void Server::SetState(const std::string& name, const std::string& version,
                      const std::string& state, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = Locate(name, version);
  if (it == entries_.end()) {
    ModelEntry e{name, version, state, reason, nullptr};
    entries_.insert(std::upper_bound(entries_.begin(), entries_.end(), e, EntryLess), std::move(e));
    return;
  }
  it->state = state;
  it->reason = reason;
  if (state != "UNLOADING" && state != "READY") it->fe.reset();
}

bool Server::Forget(const std::string& name, const std::string& version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = Locate(name, version);
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

std::shared_ptr<FrontEnd> Server::Find(std::string_view name, std::string_view version,
                                       Error* error, bool repr) const {
  std::string (*q)(std::string_view) = repr ? &Repr : &Quote;
  std::lock_guard<std::mutex> lock(mu_);
  const ModelEntry* exact = nullptr;
  const ModelEntry* newest = nullptr;
  std::vector<std::string> versions, reasons;
  bool loading = false;
  for (const ModelEntry& e : entries_) {
    if (e.name != name) continue;
    versions.push_back(e.version);
    loading |= e.state == "LOADING";
    if (e.state != "READY" && !e.reason.empty()) reasons.push_back(e.version + ": " + e.reason);
    if (e.version == version) exact = &e;
    if (e.state == "READY") newest = &e;  // entries are in version order
  }
  if (versions.empty()) {
    std::set<std::string> names;
    for (const ModelEntry& e : entries_) names.insert(e.name);
    *error = {404, "unknown model " + q(name) + ": this server serves " +
                       (names.empty() ? std::string("no model")
                                      : Joined({names.begin(), names.end()}, q))};
    return nullptr;
  }
  if (!version.empty()) {
    if (!exact) {
      *error = {404, "model " + q(name) + " has no version " + q(version) +
                         ": it has version" + (versions.size() > 1 ? "s " : " ") +
                         Joined(versions, q)};
      return nullptr;
    }
    if (exact->state == "READY") return exact->fe;
    const std::string what = "model " + q(name) + " version " + q(version);
    if (exact->state == "LOADING") *error = {503, what + " is loading"};
    else *error = {404, what + " is not available (" + exact->state +
                            (exact->reason.empty() ? "" : ": " + exact->reason) + ")"};
    return nullptr;
  }
  if (newest) return newest->fe;
  if (loading) {
    *error = {503, "model " + q(name) + " is loading"};
  } else {
    std::string why;
    for (size_t i = 0; i < reasons.size(); ++i) why += (i ? "; " : " (") + reasons[i];
    *error = {404, "model " + q(name) + " has no version available" +
                       (why.empty() ? "" : why + ")")};
  }
  return nullptr;
}

std::vector<std::shared_ptr<FrontEnd>> Server::Serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<FrontEnd>> out;
  for (const ModelEntry& e : entries_) {
    if (e.fe) out.push_back(e.fe);
  }
  return out;
}

std::vector<ModelEntry> Server::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

std::string Server::IndexJson(bool ready_only) const {
  std::string s = "[";
  bool first = true;
  for (const ModelEntry& e : Entries()) {
    if (ready_only && e.state != "READY") continue;
    s += std::string(first ? "" : ",") + "{\"name\":" + Quote(e.name) +
         ",\"version\":" + Quote(e.version) + ",\"state\":" + Quote(e.state) +
         ",\"reason\":" + Quote(e.reason) + "}";
    first = false;
  }
  return s + "]";
}

std::string Server::MetadataJson(const FrontEnd& fe) const {
  std::string doc = fe.metadata();
  constexpr std::string_view kKey = "\"versions\":[";
  const size_t at = doc.find(kKey);
  const size_t end = at == std::string::npos ? at : doc.find(']', at);
  if (end == std::string::npos) return doc;
  std::vector<std::string> versions;
  for (const ModelEntry& e : Entries()) {
    if (e.name == fe.plan().name && e.state == "READY") versions.push_back(e.version);
  }
  if (versions.empty()) return doc;
  std::string list;
  for (size_t i = 0; i < versions.size(); ++i) list += (i ? "," : "") + Quote(versions[i]);
  return doc.substr(0, at + kKey.size()) + list + doc.substr(end);
}

std::vector<std::shared_ptr<FrontEnd>> Server::StatisticsOf(std::string_view name,
                                                           std::string_view version,
                                                           Error* error, bool repr) const {
  std::vector<std::shared_ptr<FrontEnd>> fes;
  if (!name.empty() && !version.empty()) {
    if (auto fe = Find(name, version, error, repr)) fes.push_back(std::move(fe));
    return fes;
  }
  bool known = name.empty();
  for (const ModelEntry& e : Entries()) {
    if (!name.empty() && e.name != name) continue;
    known = true;
    if (e.state == "READY") fes.push_back(e.fe);
  }
  if (!known) Find(name, version, error, repr);  // the 404's message
  return fes;
}

std::string Server::StatisticsJson(std::string_view name, std::string_view version,
                                   Error* error) const {
  const std::vector<std::shared_ptr<FrontEnd>> fes = StatisticsOf(name, version, error, false);
  if (*error) return {};
  std::string s = "{\"model_stats\":[";
  for (size_t i = 0; i < fes.size(); ++i) {
    s += std::string(i ? "," : "") + std::string(StatsEntries(fes[i]->StatisticsJson()));
  }
  return s + "]}";
}

std::string Server::StatisticsMessage(std::string_view name, std::string_view version,
                                      Error* error) const {
  std::string o;
  for (const auto& fe : StatisticsOf(name, version, error, true)) {
    PutBytes(&o, 1, fe->StatisticsMessage());
  }
  return *error ? std::string() : o;
}

std::string Server::Prometheus() const {
  std::vector<std::string> texts;
  for (const auto& fe : Serving()) texts.push_back(fe->Prometheus());
  std::string unrouted =
      "# HELP paddle_ipu_unrouted_requests_total Requests no model answered (unknown model "
      "or route, malformed HTTP, a body over the limit), by HTTP status.\n"
      "# TYPE paddle_ipu_unrouted_requests_total counter\n";
  for (const auto& p : unrouted_->Copy().by_status) {
    unrouted += "paddle_ipu_unrouted_requests_total{status=\"" + std::to_string(p.first) +
                "\"} " + std::to_string(p.second) + "\n";
  }
  texts.push_back(std::move(unrouted));
  std::string limits =
      "# HELP paddle_ipu_connections_open Open HTTP and gRPC connections (at most "
      "--max-connections).\n"
      "# TYPE paddle_ipu_connections_open gauge\n"
      "paddle_ipu_connections_open " + std::to_string(connections.load()) + "\n"
      "# HELP paddle_ipu_connections_refused_total Connections refused: at --max-connections "
      "(HTTP answered 503), or accepted while the process had no file descriptor left.\n"
      "# TYPE paddle_ipu_connections_refused_total counter\n"
      "paddle_ipu_connections_refused_total " + std::to_string(refused_.load()) + "\n"
      "# HELP paddle_ipu_connections_timed_out_total Connections a timeout closed, by what "
      "the server waited for: a request's headers (--header-timeout-s), or its body, a "
      "request, an answer taken (--idle-timeout-s).\n"
      "# TYPE paddle_ipu_connections_timed_out_total counter\n";
  const char* kinds[] = {"header", "body", "idle", "write"};
  for (int i = 0; i < 4; ++i) {
    limits += "paddle_ipu_connections_timed_out_total{wait=\"" + std::string(kinds[i]) + "\"} " +
              std::to_string(timeouts_[i].load()) + "\n";
  }
  limits +=
      "# HELP paddle_ipu_io_handler_failures_total Exceptions an IO thread caught outside any "
      "request's own handling (the thread went on serving).\n"
      "# TYPE paddle_ipu_io_handler_failures_total counter\n"
      "paddle_ipu_io_handler_failures_total " + std::to_string(io_failures_.load()) + "\n";
  texts.push_back(std::move(limits));
  return MergePrometheus(texts);
}

void Server::CountTimeout(const char* which) {
  const std::string_view w(which);
  timeouts_[w == "header" ? 0 : w == "body" ? 1 : w == "idle" ? 2 : 3] += 1;
}

// -- HTTP ---------------------------------------------------------------------------

int Server::StartHttp(const std::string& host, int port, int threads, bool reuse_port) {
  if (!listeners_.empty()) throw std::runtime_error("the HTTP front end is already started");
  if (threads < 1) throw std::invalid_argument("threads must be >= 1");
  for (int i = 0; i < threads; ++i) {
    auto l = std::make_shared<Listener>();
    port = l->Listen(host, port, threads > 1 || reuse_port);
    listeners_.push_back(std::move(l));
  }
  decode_.Start(threads);
  for (auto& l : listeners_) {
    Listener* p = l.get();
    p->Accept(this);
    p->thread = std::thread([p, this] { RunIo(p->ioc, this); });
  }
  return port;
}

void Server::StopAccepting() {
  draining_ = true;
  for (auto& l : listeners_) l->StopAccepting();
}

int64_t Server::active() const {
  int64_t n = 0;
  for (const auto& fe : Serving()) n += fe->active.load();
  return n;
}

void Server::NotifyDrain() {
  std::lock_guard<std::mutex> lock(drain_mu_);
  drained_.notify_all();
}

bool Server::Drain(double timeout) {
  const auto deadline = DeadlineAfter(timeout);
  auto left = [&] {
    if (timeout < 0) return -1.0;
    return std::max(
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count(), 0.0);
  };
  for (const auto& fe : Serving()) {
    if (!fe->Drain(left())) return false;
  }
  std::unique_lock<std::mutex> lock(drain_mu_);
  auto done = [this] { return connections.load() == 0; };
  if (timeout < 0) {
    drained_.wait(lock, done);
    return true;
  }
  return drained_.wait_until(lock, deadline, done);
}

int Server::StartGrpc(const std::string& host, int port, bool reuse_port) {
  if (listeners_.empty()) throw std::runtime_error("start the HTTP front end before gRPC");
  if (grpc_port_ >= 0) throw std::runtime_error("the gRPC front end is already started");
  const bool reuse = listeners_.size() > 1 || reuse_port;
  for (auto& l : listeners_) port = l->ListenGrpc(host, port, reuse);
  for (auto& l : listeners_) {
    Listener* p = l.get();
    asio::post(p->ioc, [p, this] { p->AcceptGrpc(this); });
  }
  grpc_port_ = port;
  return port;
}

void Server::Shutdown() {
  draining_ = true;
  CloseGrpcUnary();
  for (auto& l : listeners_) {
    l->guard.reset();
    l->ioc.stop();
  }
  for (auto& l : listeners_) {
    if (l->thread.joinable()) l->thread.join();
  }
  decode_.Stop();      // after the IO threads: nothing posts to it any more
  listeners_.clear();  // destroys what was left pending (connections, answers)
}

// -- gRPC ---------------------------------------------------------------------------

std::shared_ptr<GrpcCall> Server::GrpcRefused(const Error& e, std::string trace,
                                              std::function<void(std::shared_ptr<GrpcCall>)> done) {
  return GrpcCall::Refused(e, unrouted_, std::move(trace), {}, {}, std::move(done));
}

std::shared_ptr<GrpcCall> Server::GrpcInfer(std::string msg, std::string trace,
                                            std::function<void(std::shared_ptr<GrpcCall>)> done) {
  // ModelInferRequest's model_name (1) and model_version (2).
  std::string_view name, version;
  Wire w(msg);
  while (w.ok && !w.done()) {
    const uint64_t tag = w.Varint();
    if ((tag >> 3) == 1 && (tag & 7) == 2) name = w.Bytes();
    else if ((tag >> 3) == 2 && (tag & 7) == 2) version = w.Bytes();
    else w.Skip(static_cast<int>(tag & 7));
  }
  if (!w.ok) {
    return GrpcCall::Refused({400, "malformed ModelInferRequest: the protobuf bytes do not parse"},
                             unrouted_, std::move(trace), {}, {}, std::move(done));
  }
  if (draining_) {
    return GrpcCall::Refused({503, kShuttingDown}, unrouted_, std::move(trace), name, version,
                             std::move(done));
  }
  Error e;
  std::shared_ptr<FrontEnd> fe = Find(name, version, &e, true);
  if (!fe) {
    return GrpcCall::Refused(e, unrouted_, std::move(trace), name, version, std::move(done));
  }
  return fe->GrpcInfer(std::move(msg), std::move(trace), std::move(done));
}

}  // namespace serving
}  // namespace paddle_ipu
