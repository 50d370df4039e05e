// One HTTP/1.1 connection (Boost.Beast): reads requests one at a time (keep-alive,
// pipelining, "Expect: 100-continue"), hands each to its route (routes.cc), writes
// the answer; while an infer request waits in the queue it watches for the client
// going away and for the request's timeout.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "../core/queue.h"

namespace paddle_ipu {
namespace serving {

// The binary tensor extension's header: the length of the JSON part of a body.
constexpr const char* kHeaderLength = "Inference-Header-Content-Length";

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

  void Close();
  void DoRead();
  void OnHeader(boost::beast::error_code ec);
  void ReadBody();
  void OnRead(boost::beast::error_code ec);

  // routes.cc
  void Route();
  void Infer(HttpRequest& req);
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
  boost::asio::steady_timer timer_;
  Listener* io_;
  Server* srv_;
  std::shared_ptr<FrontEnd> model_;  // the model of the request under way
  boost::beast::flat_buffer buf_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  boost::beast::http::response<boost::beast::http::string_body> res_;
  boost::beast::http::response<boost::beast::http::empty_body> continue_;
  bool keep_alive_ = true;
  bool close_after_ = false;
  bool busy_ = false;
  bool watching_ = false;
  bool gone_ = false;
  double timeout_s_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::string request_id_;  // the infer request's id, for the access log
  RequestPtr request_;
  std::shared_ptr<Job> job_;
  std::shared_ptr<Connection> hold_;  // itself, while a request waits in the queue
};

}  // namespace serving
}  // namespace paddle_ipu
