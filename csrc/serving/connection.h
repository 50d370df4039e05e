// One HTTP/1.1 connection (Boost.Beast): reads requests one at a time (keep-alive,
// pipelining, "Expect: 100-continue"), hands each to its route (routes.cc), writes
// the answer; while an infer request waits in the queue it watches for the client
// going away and for the request's timeout.
//
// Every wait on the client is bounded (the server's limits, server.h): the next
// request's first byte within the idle timeout, its headers within the header timeout
// from there, each part of its body and of the answer within the idle timeout of the
// one before (nginx's client_body_timeout and send_timeout); one timer, re-armed only
// when a phase ends sooner than it. A request's handling runs under a guard: whatever
// it throws (std::bad_alloc included) answers that request 500 naming the cause, and
// the connection's IO thread goes on.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "../core/queue.h"
#include "http_checks.h"

namespace paddle_ipu {
namespace serving {

class FrontEnd;
class Server;
struct Job;
struct Listener;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(boost::asio::ip::tcp::socket sock, Listener* io, Server* srv);
  ~Connection();

  void Start() { DoRead(); }
  // Drain: close the connection unless a request is under way (answered first).
  void OnDrain();
  // The queue finished `r` (on this connection's IO thread).
  void Answer(const RequestPtr& r);
  // The repository's load or unload request was done (on this connection's IO
  // thread; repository.cc).
  void ControlAnswer(int status, std::string body);

 private:
  using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

  // What the connection waits for from the client (the timer's phases).
  enum class Wait { kNone, kIdle, kHeader, kBody, kWrite };

  void Close();
  void DoRead();
  void ReadHeader();
  void OnHeader(boost::beast::error_code ec);
  void ReadBody();
  void OnRead(boost::beast::error_code ec);
  // Waits `w` from now (the idle or header timeout): arms the timer when it would
  // fire after the phase's end; Progress() moves a body's or an answer's deadline.
  void Await(Wait w);
  void Progress() { progress_ = std::chrono::steady_clock::now(); }
  void OnTimer(boost::beast::error_code ec);
  // Runs a request's handling: an exception answers 500 naming its cause (or closes
  // the connection when an answer is on its way already).
  template <typename F>
  void Guard(F&& f);
  void Internal(const std::string& cause);
  void WriteSome(bool keep);

  // routes.cc
  void Route();
  void Infer(HttpRequest& req);
  // After the parse (on this IO thread; a large body is parsed on the server's
  // decode threads): queue the request, or answer it.
  void Parsed(const std::shared_ptr<Job>& job, const serving::Error& parsed);
  // POST /v2/repository/index and /v2/repository/models/{m}/load|unload
  // (repository.cc); `rest` follows /v2/repository.
  void Repository(HttpRequest& req, std::string_view rest);

  void Write(boost::beast::http::status status, std::string body, const char* type,
             int64_t header_length = -1, bool retry = false, const char* allow = nullptr);
  void Error(int status, const std::string& message, bool retry = false);
  // An inference request's answer: the counters and the access log (`ran`: the
  // queue's request, when it ran).
  void Count(int status, int64_t rows, const Request* ran = nullptr);

  void Watch();
  void OnReadable(boost::beast::error_code ec);
  void OnTimeout(boost::beast::error_code ec);
  void Finished();

  boost::asio::ip::tcp::socket sock_;
  boost::asio::steady_timer timer_;     // the queued request's timeout
  boost::asio::steady_timer io_timer_;  // the waits on the client (Await)
  Wait wait_ = Wait::kNone;
  Wait timed_out_ = Wait::kNone;        // the wait a timeout ended (answered 408)
  bool io_armed_ = false;
  std::chrono::steady_clock::time_point wait_start_, progress_, io_expiry_;
  Listener* io_;
  Server* srv_;
  std::shared_ptr<FrontEnd> model_;  // the model of the request under way
  boost::beast::flat_buffer buf_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  boost::beast::http::response<boost::beast::http::string_body> res_;
  std::optional<boost::beast::http::response_serializer<boost::beast::http::string_body>> sr_;
  boost::beast::http::response<boost::beast::http::empty_body> continue_;
  bool keep_alive_ = true;
  bool close_after_ = false;
  bool busy_ = false;
  bool writing_ = false;  // an answer is being written
  bool watching_ = false;
  bool gone_ = false;
  double timeout_s_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::string request_id_;  // the infer request's id, for the access log
  RequestPtr request_;
  std::shared_ptr<Job> job_;
  std::shared_ptr<Connection> hold_;  // itself, while a request waits in the queue
};

template <typename F>
void Connection::Guard(F&& f) {
  std::string cause;
  try {
    f();
    return;
  } catch (const std::bad_alloc&) {
    cause = "the server ran out of memory handling the request (std::bad_alloc)";
  } catch (const std::exception& e) {
    cause = std::string("the server failed handling the request: ") + e.what();
  } catch (...) {
    cause = "the server failed handling the request (an unknown exception)";
  }
  Internal(cause);
}

}  // namespace serving
}  // namespace paddle_ipu
