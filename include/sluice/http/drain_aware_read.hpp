#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/detail/bind_handler.hpp>
#include <boost/asio/detail/fenced_block.hpp>
#include <boost/asio/detail/handler_alloc_helpers.hpp>
#include <boost/asio/detail/handler_cont_helpers.hpp>
#include <boost/asio/detail/handler_work.hpp>
#include <boost/asio/detail/memory.hpp>
#include <boost/asio/detail/reactive_socket_service.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/query.hpp>
#include <boost/version.hpp>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "sluice/http/network_errors.hpp"

namespace sluice {

// Socket reads that skip the system call Asio would spend on an empty socket.
//
// Asio's epoll reactor tries every read before it waits for readiness, and
// stops trying only once a read has returned nothing at all (the end of the
// stream). A proxy's reads nearly always come after it has sent something
// and before the peer could answer, so that first try finds the socket
// empty: two wasted system calls per proxied request, one for the
// upstream's answer and one for the client's next request. Two ways out,
// each safe only where its condition holds:
//
// - ReadStart::awaiting_reply: the caller has just sent the peer something
//   it answers, completely and without waiting in between (no trip through
//   the event loop between the send and this read). The answer, or the
//   peer's reset, arrives after the send and so raises a new edge in epoll;
//   the read waits for it without trying first.
// - A socket with TCP_INQ set (enable_drain_tracking) reports with each read
//   how much it still holds. A read that left it empty, with no end of
//   stream pending, is reported to the reactor as "done and exhausted": the
//   next read on that socket, by these functions or by Asio's own, waits for
//   epoll's next edge without trying first, as nginx does after a short
//   read. Anything that arrives later raises that edge. TCP_INQ cannot show
//   a reset that waits behind the data read; the wake-up that brought both
//   reported a hang-up (EPOLLERR/EPOLLHUP), so a read in such a wake-up
//   leaves the socket to be tried again (hang_up_reported), as nginx does
//   with EPOLLRDHUP. A reset that comes after the wake-up raises an edge of
//   its own.
//
// Only for plain TCP sockets on an io_context with Asio's reactor (epoll on
// Linux). Completes like async_read_some: (error_code, bytes read). The
// operation is written against Boost 1.81's reactor internals; with any
// other Boost, or Asio's io_uring backend, these are plain async_read_some.
enum class ReadStart { try_at_once, awaiting_reply };

template <class Token>
auto drain_aware_read_some(boost::asio::ip::tcp::socket& socket, boost::asio::mutable_buffer buffer,
                           Token&& token, ReadStart start = ReadStart::try_at_once);

// Sets TCP_INQ on a socket, so that its reads can tell when they emptied it
// (on a listener: on the connections it accepts).
inline void enable_drain_tracking(int descriptor) {
  const int on = 1;
  // Without it (an old kernel), reads simply try before they wait.
  ::setsockopt(descriptor, IPPROTO_TCP, TCP_INQ, &on, sizeof on);
}
inline void enable_drain_tracking(boost::asio::ip::tcp::socket& socket) {
  enable_drain_tracking(socket.native_handle());
}

#if BOOST_VERSION == 108100 && defined(BOOST_ASIO_HAS_EPOLL) && \
    !defined(BOOST_ASIO_HAS_IO_URING_AS_DEFAULT)
#define SLUICE_HAS_DRAIN_AWARE_READ 1
#else
#define SLUICE_HAS_DRAIN_AWARE_READ 0
#endif

#if SLUICE_HAS_DRAIN_AWARE_READ
namespace drain_aware_detail {

namespace asio_detail = boost::asio::detail;
using SocketService = asio_detail::reactive_socket_service<boost::asio::ip::tcp>;

// The operation whose first try is being skipped. Set only while this
// thread starts it: a try from the reactor's readiness event is never
// skipped.
inline thread_local const void* skipping_first_try = nullptr;

// Whether recvmsg's TCP_INQ report says the socket holds nothing more. The
// kernel reports 1 when only the end of the stream is left, so a pending end
// is never mistaken for an empty socket.
inline bool left_nothing(msghdr& message) {
  for (cmsghdr* part = CMSG_FIRSTHDR(&message); part != nullptr;
       part = CMSG_NXTHDR(&message, part)) {
    if (part->cmsg_level == IPPROTO_TCP && part->cmsg_type == TCP_CM_INQ &&
        part->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int queued = 0;
      std::memcpy(&queued, CMSG_DATA(part), sizeof queued);
      return queued == 0;
    }
  }
  return false;
}

// Asio keeps the events of a descriptor's latest wake-up in the descriptor's
// own operation (task_result_, what the scheduler passes on as "bytes
// transferred"), and they stay there until the next wake-up.
struct OperationParts : asio_detail::scheduler_operation {
  static unsigned int ready_events(const asio_detail::scheduler_operation& operation) {
    return operation.*(&OperationParts::task_result_);
  }
};

// Whether the socket's latest wake-up reported an error or a hang-up. A
// reset that came with the data just read is reported so, and TCP_INQ does
// not show it: such a socket is not taken for drained. A reset that arrives
// after that wake-up raises an edge of its own.
inline bool hang_up_reported(asio_detail::reactor::per_descriptor_data descriptor) {
  if (descriptor == nullptr) return true;
  // A C-style cast: descriptor_state derives from its operation privately.
  const auto* operation = (const asio_detail::scheduler_operation*)descriptor;  // NOLINT
  return (OperationParts::ready_events(*operation) & (EPOLLERR | EPOLLHUP)) != 0;
}

template <class Handler, class IoExecutor>
class ReceiveOp : public asio_detail::reactor_op {
 public:
  BOOST_ASIO_DEFINE_HANDLER_PTR(ReceiveOp);

  ReceiveOp(asio_detail::socket_type socket, asio_detail::reactor::per_descriptor_data descriptor,
            boost::asio::mutable_buffer buffer, Handler& handler, const IoExecutor& io_executor)
      : reactor_op(error_code{}, &ReceiveOp::do_perform, &ReceiveOp::do_complete),
        socket_(socket),
        descriptor_(descriptor),
        buffer_(buffer),
        handler_(std::move(handler)),
        work_(handler_, io_executor) {}

  static status do_perform(reactor_op* base) {
    auto* op = static_cast<ReceiveOp*>(base);
    if (skipping_first_try == op) return not_done;
    iovec room{op->buffer_.data(), op->buffer_.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr message{};
    message.msg_iov = &room;
    message.msg_iovlen = 1;
    for (;;) {
      message.msg_control = control;
      message.msg_controllen = sizeof control;
      const auto received = ::recvmsg(op->socket_, &message, 0);
      if (received > 0) {
        op->ec_ = {};
        op->bytes_transferred_ = static_cast<std::size_t>(received);
        return left_nothing(message) && !hang_up_reported(op->descriptor_) ? done_and_exhausted
                                                                           : done;
      }
      op->bytes_transferred_ = 0;
      if (received == 0) {
        // The end of the stream stays "done": the next read tries at once
        // and finds it again.
        op->ec_ = boost::asio::error::eof;
        return done;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return not_done;
      op->ec_ = error_code(errno, boost::asio::error::get_system_category());
      return done;
    }
  }

  static void do_complete(void* owner, asio_detail::operation* base, const error_code& /*ec*/,
                          std::size_t /*bytes_transferred*/) {
    auto* op = static_cast<ReceiveOp*>(base);
    ptr p = {boost::asio::detail::addressof(op->handler_), op, op};
    asio_detail::handler_work<Handler, IoExecutor> work(std::move(op->work_));
    // The handler moves out before the operation's memory is freed: the
    // handler may own that memory.
    asio_detail::binder2<Handler, error_code, std::size_t> handler(op->handler_, op->ec_,
                                                                   op->bytes_transferred_);
    p.h = boost::asio::detail::addressof(handler.handler_);
    p.reset();
    if (owner) {
      asio_detail::fenced_block fence(asio_detail::fenced_block::half);
      work.complete(handler, handler.handler_);
    }
  }

 private:
  asio_detail::socket_type socket_;
  asio_detail::reactor::per_descriptor_data descriptor_;
  boost::asio::mutable_buffer buffer_;
  Handler handler_;
  asio_detail::handler_work<Handler, IoExecutor> work_;
};

// Reaches the protected parts of Asio's socket and socket service that its
// own async_receive uses; nothing of these types is ever constructed.
struct SocketParts : boost::asio::ip::tcp::socket {
  static auto& io_object(boost::asio::ip::tcp::socket& socket) {
    return socket.*(&SocketParts::impl_);
  }
};
struct ServiceParts : SocketService {
  using Cancellation = SocketService::reactor_op_cancellation;
  static void start(SocketService& service, SocketService::implementation_type& impl,
                    asio_detail::reactor_op* op, bool is_continuation, bool nothing_to_read) {
    (service.*(&ServiceParts::start_op))(impl, asio_detail::reactor::read_op, op, is_continuation,
                                         /*is_non_blocking=*/true, nothing_to_read);
  }
};

struct InitiateReceive {
  template <class Handler>
  void operator()(Handler&& handler, boost::asio::ip::tcp::socket* socket,
                  boost::asio::mutable_buffer buffer, ReadStart start) const {
    using HandlerType = std::decay_t<Handler>;
    using IoExecutor = boost::asio::ip::tcp::socket::executor_type;
    using Op = ReceiveOp<HandlerType, IoExecutor>;
    auto& io_object = SocketParts::io_object(*socket);
    auto& impl = io_object.get_implementation();
    HandlerType& local_handler = handler;
    const bool is_continuation = boost_asio_handler_cont_helpers::is_continuation(local_handler);
    auto slot = boost::asio::get_associated_cancellation_slot(local_handler);

    typename Op::ptr p = {boost::asio::detail::addressof(local_handler),
                          Op::ptr::allocate(local_handler), nullptr};
    p.p = new (p.v)
        Op(impl.socket_, impl.reactor_data_, buffer, local_handler, io_object.get_executor());
    if (slot.is_connected()) {
      auto& context = boost::asio::query(io_object.get_executor(), boost::asio::execution::context);
      auto& reactor = boost::asio::use_service<asio_detail::reactor>(context);
      p.p->cancellation_key_ = &slot.template emplace<ServiceParts::Cancellation>(
          &reactor, &impl.reactor_data_, impl.socket_, asio_detail::reactor::read_op);
    }
    if (start == ReadStart::awaiting_reply) skipping_first_try = p.p;
    // A read into no room completes at once with nothing, as Asio's does.
    ServiceParts::start(io_object.get_service(), impl, p.p, is_continuation, buffer.size() == 0);
    skipping_first_try = nullptr;
    p.v = p.p = nullptr;
  }
};

}  // namespace drain_aware_detail

template <class Token>
auto drain_aware_read_some(boost::asio::ip::tcp::socket& socket, boost::asio::mutable_buffer buffer,
                           Token&& token, ReadStart start) {
  return boost::asio::async_initiate<Token, void(error_code, std::size_t)>(
      drain_aware_detail::InitiateReceive{}, token, &socket, buffer, start);
}
#else
template <class Token>
auto drain_aware_read_some(boost::asio::ip::tcp::socket& socket, boost::asio::mutable_buffer buffer,
                           Token&& token, ReadStart /*start*/) {
  return socket.async_read_some(buffer, std::forward<Token>(token));
}
#endif

}  // namespace sluice
