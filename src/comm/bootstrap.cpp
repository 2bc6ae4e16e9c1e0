#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"

namespace gpulab::comm {

namespace {

using core::InputError;
using Clock = std::chrono::steady_clock;

constexpr int kDefaultPort = 29500;  // torchrun's
constexpr uint32_t kMagic = 0x47504c42;  // "GPLB": a hello from something else is refused
constexpr std::chrono::milliseconds kRetryPause{100};

// Replies of rank 0, one byte before the id.
enum Reply : uint8_t { kOk = 0, kWorldMismatch = 1, kDuplicateRank = 2 };

int parse_int(const char* name, const std::string& value) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size())
    throw InputError(std::string(name) + "='" + value + "' is not an integer");
  return v;
}

int parse_port(const char* name, const std::string& value) {
  int v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 1 || v > 65535)
    throw InputError(std::string(name) + "='" + value + "' is not a port number (1-65535)");
  return v;
}

struct Source {
  const char* launcher;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_size;  // ranks on this node: all of them means one node, so MASTER_ADDR may be left out
  const char* step;        // set only where the launcher started this process (else its variables are ignored)
};
constexpr Source kSources[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", nullptr},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     nullptr},
    // An sbatch script itself has SLURM_PROCID and SLURM_NTASKS too: only a task srun started is a rank.
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_STEP_NUM_TASKS"},
};

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Deadline {
  Clock::time_point end;
  int remaining_ms() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    return int(std::clamp<int64_t>(left, 0, 1 << 30));
  }
  bool passed() const { return Clock::now() >= end; }
};

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, const Deadline& d) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, d.remaining_ms());
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw core::Error(std::string("rendezvous: poll failed: ") + std::strerror(errno));
  }
}

// Whole-buffer transfers on a non-blocking socket; false on timeout or a closed peer.
bool send_all(int fd, const void* data, size_t n, const Deadline& d) {
  auto* p = static_cast<const char*>(data);
  while (n) {
    if (!wait_for(fd, POLLOUT, d)) return false;
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n, const Deadline& d) {
  auto* p = static_cast<char*>(data);
  while (n) {
    if (!wait_for(fd, POLLIN, d)) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return false;
    p += k, n -= size_t(k);
  }
  return true;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

struct Hello {
  uint32_t magic, rank, world;
};

// A rank sends its hello as soon as it connects. A connection silent for longer (something else
// that found the port open) is dropped, so that it cannot hold up the ranks queued behind it
// until the rendezvous times out: rank 0 reads one connection at a time.
constexpr auto kHelloTimeout = std::chrono::seconds(5);

Hello to_wire(Hello h) { return {htonl(h.magic), htonl(h.rank), htonl(h.world)}; }
Hello from_wire(Hello h) { return {ntohl(h.magic), ntohl(h.rank), ntohl(h.world)}; }

// Every interface, IPv6 with IPv4-mapped addresses where the host has IPv6, else IPv4.
Fd listen_on(int port, int backlog) {
  std::string why;
  for (const int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) continue;
    const int one = 1, zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(uint16_t(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(uint16_t(port));
      len = sizeof *a;
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd.get(), backlog) != 0) {
      why = std::strerror(errno);
      if (errno == EADDRINUSE || errno == EACCES) break;  // the other family would say the same
      continue;
    }
    set_nonblocking(fd.get());
    return fd;
  }
  throw InputError("rank 0 cannot listen on MASTER_PORT=" + std::to_string(port) + ": " + why +
                   "; choose a free port, the same on every rank");
}

UniqueId serve_id(const JobEnv& job, std::chrono::milliseconds timeout, const std::function<UniqueId()>& make_id) {
  const Deadline deadline{Clock::now() + timeout};
  const UniqueId id = make_id();
  Fd server = listen_on(job.master_port, job.world);
  std::vector<std::optional<Fd>> peers(size_t(job.world));
  int joined = 1;
  while (joined < job.world) {
    if (!wait_for(server.get(), POLLIN, deadline)) {
      std::string missing;
      int listed = 0;
      for (int r = 1; r < job.world; ++r)
        if (!peers[size_t(r)] && listed++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      if (listed > 16) missing += ", ...";
      throw core::Error("rank 0: rank" + std::string(job.world - joined > 1 ? "s " : " ") + missing +
                        " did not connect to port " + std::to_string(job.master_port) + " within " + seconds_text(timeout) +
                        " (are they running, with the same MASTER_ADDR, MASTER_PORT and a WORLD_SIZE of " +
                        std::to_string(job.world) + "?)");
    }
    Fd peer(::accept4(server.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (peer.get() < 0) continue;  // the peer gave up between poll and accept
    Hello h{};
    const Deadline hello_deadline{std::min(deadline.end, Clock::now() + kHelloTimeout)};
    if (!recv_all(peer.get(), &h, sizeof h, hello_deadline)) continue;  // a connection that said nothing
    h = from_wire(h);
    if (h.magic != kMagic) continue;  // not one of ours (a port scanner, another program)
    const Reply reply = int(h.world) != job.world ? kWorldMismatch
                        : h.rank == 0 || int(h.rank) >= job.world || peers[h.rank] ? kDuplicateRank
                                                                                     : kOk;
    if (reply != kOk) {
      send_all(peer.get(), &reply, 1, deadline);
      if (reply == kWorldMismatch)
        throw InputError("rank " + std::to_string(h.rank) + " has a world size of " + std::to_string(h.world) +
                         " but rank 0 has " + std::to_string(job.world) + ": every rank needs the same WORLD_SIZE");
      throw InputError("two processes claim rank " + std::to_string(h.rank) + " of " + std::to_string(job.world) +
                       ": every rank needs its own RANK");
    }
    peers[h.rank] = std::move(peer);
    ++joined;
  }
  for (int r = 1; r < job.world; ++r) {
    const int fd = peers[size_t(r)]->get();
    const Reply ok = kOk;
    if (!send_all(fd, &ok, 1, deadline) || !send_all(fd, id.data(), id.size(), deadline))
      throw core::Error("rank 0: rank " + std::to_string(r) + " left before it received the NCCL id");
  }
  return id;
}

// One connection attempt to any address of host:port, within `d`; the reason it failed otherwise.
std::optional<Fd> try_connect(const std::string& host, int port, const Deadline& d, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list); rc != 0) {
    why = ::gai_strerror(rc);
    return std::nullopt;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(list, ::freeaddrinfo);
  for (const addrinfo* a = list; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) continue;
    int err = ::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {  // bounded by the deadline, not by the kernel's SYN retries
      if (!wait_for(fd.get(), POLLOUT, d)) {
        why = "connection timed out";
        continue;
      }
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) return fd;
    why = std::strerror(err);
  }
  return std::nullopt;
}

UniqueId fetch_id(const JobEnv& job, std::chrono::milliseconds timeout) {
  const Deadline deadline{Clock::now() + timeout};
  const std::string where = job.master_addr + ":" + std::to_string(job.master_port);
  const std::string me = "rank " + std::to_string(job.rank);
  std::string why = "no attempt";
  std::optional<Fd> fd;
  while (!(fd = try_connect(job.master_addr, job.master_port, deadline, why))) {
    if (deadline.passed())
      throw core::Error(me + ": could not reach rank 0 at " + where + " within " + seconds_text(timeout) + " (" + why +
                        "); is rank 0 running, and MASTER_ADDR/MASTER_PORT the same on every rank?");
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(kRetryPause, std::chrono::milliseconds(deadline.remaining_ms())));
  }
  const Hello hello = to_wire({kMagic, uint32_t(job.rank), uint32_t(job.world)});
  uint8_t reply = 0;
  UniqueId id{};
  if (!send_all(fd->get(), &hello, sizeof hello, deadline) || !recv_all(fd->get(), &reply, 1, deadline))
    throw core::Error(me + ": rank 0 at " + where + " sent no NCCL id within " + seconds_text(timeout) +
                      " (not every one of the " + std::to_string(job.world) + " ranks joined)");
  if (reply == kWorldMismatch)
    throw InputError(me + ": rank 0 at " + where + " has another world size than " + std::to_string(job.world) +
                     ": every rank needs the same WORLD_SIZE");
  if (reply == kDuplicateRank) throw InputError(me + ": another process at " + where + " already claimed this rank");
  if (!recv_all(fd->get(), id.data(), id.size(), deadline))
    throw core::Error(me + ": rank 0 at " + where + " closed the connection before sending the whole NCCL id");
  return id;
}

}  // namespace

JobEnv job_from_env(const GetEnv& getenv) {
  auto get = [&](const char* name) -> std::optional<std::string> {
    const char* v = name ? getenv(name) : nullptr;
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
  JobEnv job;
  const Source* src = nullptr;
  for (const Source& s : kSources) {
    const auto rank = get(s.rank), world = get(s.world);
    if ((!rank && !world) || (s.step && !get(s.step))) continue;
    if (!rank || !world)
      throw InputError(std::string(rank ? s.rank : s.world) + " is set but " + (rank ? s.world : s.rank) +
                       " is not: a " + s.launcher + " job needs both");
    src = &s;
    job.launcher = s.launcher;
    job.world = parse_int(s.world, *world);
    job.rank = parse_int(s.rank, *rank);
    const auto local = get(s.local_rank);
    job.local_rank = local ? parse_int(s.local_rank, *local) : job.rank;
    break;
  }
  if (!src) return job;
  const std::string w = std::string(src->world) + "=" + std::to_string(job.world);
  if (job.world < 1) throw InputError(w + ": the world size must be at least 1");
  if (job.rank < 0 || job.rank >= job.world)
    throw InputError(std::string(src->rank) + "=" + std::to_string(job.rank) + " is outside " + w + " (ranks 0.." +
                     std::to_string(job.world - 1) + ")");
  if (job.local_rank < 0 || job.local_rank >= job.world)
    throw InputError(std::string(src->local_rank) + "=" + std::to_string(job.local_rank) + " is outside " + w);
  if (src->step && parse_int(src->step, *get(src->step)) != job.world)
    throw InputError(std::string(src->step) + "=" + *get(src->step) + " disagrees with " + w);
  if (job.world == 1) return job;

  if (const auto own = get("GPULAB_MASTER_PORT")) {
    job.master_port = parse_port("GPULAB_MASTER_PORT", *own);
  } else if (const auto port = get("MASTER_PORT")) {
    job.master_port = parse_port("MASTER_PORT", *port);
    // torchrun's agent serves its own store on MASTER_PORT: ours takes the next port.
    if (job.launcher == "torchrun" && get("TORCHELASTIC_USE_AGENT_STORE") == "True") {
      if (job.master_port == 65535) throw InputError("MASTER_PORT=65535 leaves no port for gpulab's rendezvous: set GPULAB_MASTER_PORT");
      ++job.master_port;
    }
  } else if (const auto slurm_job = get("SLURM_JOB_ID"); slurm_job && job.launcher == "slurm") {
    job.master_port = 20000 + parse_int("SLURM_JOB_ID", *slurm_job) % 40000;
  } else {
    job.master_port = kDefaultPort;
  }
  if (const auto addr = get("MASTER_ADDR")) {
    job.master_addr = *addr;
  } else {
    const auto local_size = get(src->local_size);
    const auto nodes = get("SLURM_NNODES");
    const bool one_node = local_size ? parse_int(src->local_size, *local_size) == job.world
                                     : job.launcher == "slurm" && nodes && parse_int("SLURM_NNODES", *nodes) == 1;
    if (!one_node)
      throw InputError("MASTER_ADDR is not set: a job of " + w +
                       " over several nodes needs rank 0's host in MASTER_ADDR (and a free MASTER_PORT), the same "
                       "on every rank" +
                       (job.launcher == "slurm" ? " (e.g. export MASTER_ADDR=$(scontrol show hostnames "
                                                  "$SLURM_JOB_NODELIST | head -n1))"
                                                : ""));
    job.master_addr = "127.0.0.1";
  }
  return job;
}

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, t.count() % 1000 ? "%.1f s" : "%.0f s", double(t.count()) / 1000.0);
  return buf;
}

JobEnv job_from_env() {
  return job_from_env([](const char* name) -> const char* { return std::getenv(name); });
}

UniqueId rendezvous(const JobEnv& job, std::chrono::milliseconds timeout, const std::function<UniqueId()>& make_id) {
  if (job.world == 1) return make_id();
  if (job.master_port < 1 || job.master_port > 65535)
    throw InputError("MASTER_PORT=" + std::to_string(job.master_port) + " is not a port number (1-65535)");
  return job.rank == 0 ? serve_id(job, timeout, make_id) : fetch_id(job, timeout);
}

}  // namespace gpulab::comm
