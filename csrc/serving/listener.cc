// The HTTP listeners and the front end's HTTP life cycle: start, stop accepting,
// shut down (see listener.h).
#include "listener.h"

#include <sys/socket.h>

#include <boost/beast/core/error.hpp>

#include "connection.h"
#include "front_end.h"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace paddle_ipu {
namespace serving {

int Listener::Listen(const std::string& host, int port, bool reuse_port) {
  acceptor.emplace(ioc);
  tcp::endpoint ep(asio::ip::make_address(host), static_cast<unsigned short>(port));
  acceptor->open(ep.protocol());
  acceptor->set_option(asio::socket_base::reuse_address(true));
  // Every IO thread accepts on its own socket, and so does every worker process
  // (--workers): the kernel spreads the connections. Only then: otherwise a second
  // server on the same port would silently take half of the traffic.
  if (reuse_port) {
    int one = 1;
    ::setsockopt(acceptor->native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  }
  boost::system::error_code ec;
  acceptor->bind(ep, ec);
  if (ec) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) +
                             ": " + ec.message());
  }
  acceptor->listen(asio::socket_base::max_listen_connections);
  return acceptor->local_endpoint().port();
}

void Listener::Accept(FrontEnd* fe) {
  acceptor->async_accept([this, fe](boost::beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      boost::beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Connection>(std::move(s), this, fe)->Start();
    }
    Accept(fe);
  });
}

void Listener::StopAccepting() {
  asio::post(ioc, [this] {
    boost::beast::error_code ignored;
    if (acceptor) acceptor->close(ignored);
    std::vector<Connection*> all(connections.begin(), connections.end());
    for (Connection* c : all) c->OnDrain();
  });
}

void Listener::Deliver(std::vector<RequestPtr>&& finished) {
  asio::post(ioc, [done = std::move(finished)] {
    for (const RequestPtr& r : done) {
      auto job = std::static_pointer_cast<Job>(r->owner);
      if (auto c = job->connection.lock()) c->Answer(r);
    }
  });
}

int FrontEnd::StartHttp(const std::string& host, int port, int threads, bool reuse_port) {
  if (!listeners_.empty()) throw std::runtime_error("the HTTP front end is already started");
  if (threads < 1) throw std::invalid_argument("threads must be >= 1");
  for (int i = 0; i < threads; ++i) {
    auto l = std::make_shared<Listener>();
    port = l->Listen(host, port, threads > 1 || reuse_port);
    listeners_.push_back(std::move(l));
  }
  for (auto& l : listeners_) {
    Listener* p = l.get();
    p->Accept(this);
    p->thread = std::thread([p] { p->ioc.run(); });
  }
  return port;
}

void FrontEnd::StopAccepting() {
  draining_ = true;
  for (auto& l : listeners_) l->StopAccepting();
}

void FrontEnd::Shutdown() {
  draining_ = true;
  for (auto& l : listeners_) {
    l->guard.reset();
    l->ioc.stop();
  }
  for (auto& l : listeners_) {
    if (l->thread.joinable()) l->thread.join();
  }
  listeners_.clear();  // destroys what was left pending (connections, answers)
}

}  // namespace serving
}  // namespace paddle_ipu
