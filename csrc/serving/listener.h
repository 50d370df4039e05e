// One HTTP IO thread: its io_context, its listening socket (every IO thread accepts
// on its own, with SO_REUSEPORT where there are several), the connections it runs,
// and the sink through which the queue hands it the requests a run finished.
#pragma once

#include <boost/asio.hpp>

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
class Server;

struct Listener : NativeSink, std::enable_shared_from_this<Listener> {
  boost::asio::io_context ioc{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard{
      ioc.get_executor()};
  std::optional<boost::asio::ip::tcp::acceptor> acceptor;
  std::thread thread;
  std::unordered_set<Connection*> connections;  // touched on this thread only

  // Binds and listens on `host` (an address) and `port` (0: a free one); returns the port.
  int Listen(const std::string& host, int port, bool reuse_port);
  // Accepts connections for `srv` until the acceptor closes.
  void Accept(Server* srv);
  // Closes the acceptor, and the connections that wait for a request.
  void StopAccepting();
  // Posts the answers of finished requests to their connections.
  void Deliver(std::vector<RequestPtr>&& finished) override;
};

}  // namespace serving
}  // namespace paddle_ipu
