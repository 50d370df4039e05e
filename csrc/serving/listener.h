// One IO thread: its io_context, its listening sockets, HTTP's and gRPC's (every IO
// thread accepts on its own, with SO_REUSEPORT where there are several), the
// connections it runs, and the sink through which the queue hands it the HTTP
// requests a run finished.
#pragma once

#include <boost/asio.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "../core/queue.h"

namespace paddle_ipu {
namespace serving {

class Connection;
class GrpcConnection;
class Server;

struct Listener : NativeSink, std::enable_shared_from_this<Listener> {
  // Touched on this thread only. Declared before the io_context: destroying it
  // destroys the connections its handlers still hold, which leave these sets.
  std::unordered_set<Connection*> connections;
  std::unordered_set<GrpcConnection*> grpc_connections;
  boost::asio::io_context ioc{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard{
      ioc.get_executor()};
  std::optional<boost::asio::ip::tcp::acceptor> acceptor;
  std::optional<boost::asio::ip::tcp::acceptor> grpc_acceptor;
  // accept() failed for want of resources (EMFILE: the open-file limit): each acceptor
  // waits a while before it tries again, instead of spinning on the error.
  std::optional<boost::asio::steady_timer> backoff, grpc_backoff;
  bool backoff_logged = false;
  std::thread thread;

  // Binds and listens on `host` (an address) and `port` (0: a free one); returns the port.
  int Listen(const std::string& host, int port, bool reuse_port);
  // As Listen(), gRPC's socket.
  int ListenGrpc(const std::string& host, int port, bool reuse_port);
  // Accepts connections for `srv` until the acceptor closes; a connection over the
  // server's max_connections is refused (HTTP: a 503 answer, then closed).
  void Accept(Server* srv);
  void AcceptGrpc(Server* srv);
  // Closes the acceptors, and the connections that wait for a request (gRPC's are
  // sent GOAWAY, and close once their calls are answered).
  void StopAccepting();
  // Posts the answers of finished requests to their connections.
  void Deliver(std::vector<RequestPtr>&& finished) override;

 private:
  // Whether the connection `s` just accepted may be served (else it was refused).
  bool Admit(Server* srv, boost::asio::ip::tcp::socket& s, bool http);
  // After a failed accept: true (and `again` runs later) when it was for want of
  // resources; false for an error of that one connection (try again at once).
  bool BackOff(const boost::system::error_code& ec, std::optional<boost::asio::steady_timer>& t,
               std::function<void()> again);
};

}  // namespace serving
}  // namespace paddle_ipu
