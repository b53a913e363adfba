#include "server/cmd/listen_check.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace fastformer {

std::string listen_problem(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) return "";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.find_first_of("/") != std::string::npos) return "";  // unix: and other schemes

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return "cannot resolve host '" + host + "': " + gai_strerror(rc);
  }
  std::string problem;
  for (const addrinfo* a = found; a != nullptr && problem.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one,
               sizeof one);  // as servers bind: TIME_WAIT is no conflict
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      problem = errno == EADDRINUSE
                    ? std::string("address already in use (another process is listening on it)")
                    : std::string(std::strerror(errno));
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (!problem.empty()) problem[0] = char(std::tolower(static_cast<unsigned char>(problem[0])));
  return problem;
}

}  // namespace fastformer
