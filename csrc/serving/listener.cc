// The HTTP listeners (see listener.h; the server's HTTP life cycle is in server.cc).
#include "listener.h"

#include <sys/socket.h>

#include <boost/beast/core/error.hpp>

#include "connection.h"
#include "grpc_connection.h"
#include "server.h"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace paddle_ipu {
namespace serving {

namespace {

int Bind(std::optional<tcp::acceptor>& acceptor, asio::io_context& ioc, const std::string& host,
         int port, bool reuse_port) {
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

}  // namespace

int Listener::Listen(const std::string& host, int port, bool reuse_port) {
  return Bind(acceptor, ioc, host, port, reuse_port);
}

int Listener::ListenGrpc(const std::string& host, int port, bool reuse_port) {
  return Bind(grpc_acceptor, ioc, host, port, reuse_port);
}

void Listener::AcceptGrpc(Server* srv) {
  grpc_acceptor->async_accept([this, srv](boost::beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !grpc_acceptor->is_open()) return;
    if (!ec) {
      boost::beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      if (srv->draining()) {
        s.close(ignored);
      } else {
        std::make_shared<GrpcConnection>(std::move(s), this, srv)->Start();
      }
    }
    AcceptGrpc(srv);
  });
}

void Listener::Accept(Server* srv) {
  acceptor->async_accept([this, srv](boost::beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (!ec) {
      boost::beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Connection>(std::move(s), this, srv)->Start();
    }
    Accept(srv);
  });
}

void Listener::StopAccepting() {
  asio::post(ioc, [this] {
    boost::beast::error_code ignored;
    if (acceptor) acceptor->close(ignored);
    if (grpc_acceptor) grpc_acceptor->close(ignored);
    std::vector<Connection*> all(connections.begin(), connections.end());
    for (Connection* c : all) c->OnDrain();
    std::vector<GrpcConnection*> grpc(grpc_connections.begin(), grpc_connections.end());
    for (GrpcConnection* c : grpc) c->OnDrain();
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

}  // namespace serving
}  // namespace paddle_ipu
