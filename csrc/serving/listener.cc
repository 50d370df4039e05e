// The HTTP listeners (see listener.h; the server's HTTP life cycle is in server.cc).
#include "listener.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

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

bool Listener::Admit(Server* srv, tcp::socket& s, bool http) {
  boost::beast::error_code ignored;
  if (srv->draining()) {
    s.close(ignored);
    return false;
  }
  const ServerLimits& l = srv->limits();
  if (l.max_connections > 0 && srv->connections.load() >= l.max_connections) {
    srv->CountRefused();
    if (http) {  // told why, in what fits one write to a new socket (or nothing)
      static const std::string kBusy = [] {
        const std::string body =
            "{\"error\":\"the server has as many connections open as it takes "
            "(--max-connections); retry later\"}";
        return "HTTP/1.1 503 Service Unavailable\r\nServer: paddle-ipu\r\n"
               "Content-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
      }();
      s.non_blocking(true, ignored);
      s.write_some(asio::buffer(kBusy), ignored);
      s.shutdown(tcp::socket::shutdown_send, ignored);
    }
    s.close(ignored);
    return false;
  }
  s.set_option(tcp::no_delay(true), ignored);
  return true;
}

bool Listener::BackOff(const boost::system::error_code& ec, std::optional<asio::steady_timer>& t,
                       std::function<void()> again) {
  const int e = ec.value();
  const bool starved = ec.category() == boost::system::system_category() &&
                       (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM);
  if (!starved) return false;
  if (!backoff_logged) {
    backoff_logged = true;
    std::fprintf(stderr,
                 "paddle-ipu: accept() failed (%s): new connections wait 100 ms at a time until "
                 "a descriptor is free; raise the open-file limit (ulimit -n) above "
                 "--max-connections\n",
                 ec.message().c_str());
  }
  if (!t) t.emplace(ioc);
  t->expires_after(std::chrono::milliseconds(100));
  t->async_wait([again = std::move(again)](const boost::system::error_code& w) {
    if (!w) again();
  });
  return true;
}

void Listener::AcceptGrpc(Server* srv) {
  grpc_acceptor->async_accept([this, srv](boost::beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !grpc_acceptor->is_open()) return;
    if (ec && BackOff(ec, grpc_backoff, [this, srv] { AcceptGrpc(srv); })) return;
    if (!ec && Admit(srv, s, false)) {
      backoff_logged = false;
      std::make_shared<GrpcConnection>(std::move(s), this, srv)->Start();
    }
    AcceptGrpc(srv);
  });
}

void Listener::Accept(Server* srv) {
  acceptor->async_accept([this, srv](boost::beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
    if (ec && BackOff(ec, backoff, [this, srv] { Accept(srv); })) return;
    if (!ec && Admit(srv, s, true)) {
      backoff_logged = false;
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
    if (backoff) backoff->cancel();
    if (grpc_backoff) grpc_backoff->cancel();
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
