// tests/support/command_loop.hpp: the read-decode-answer loop the scripted test servers share.
// `read(span)` fills the span like recv() (returns <= 0 at the end); each decoded command (an
// array of bulk strings) goes to `on(command)`, which returns false to end the conversation.
// It ends too on an empty command or bytes that are not RESP.
//
//   serve_commands([&](std::span<std::byte> b) { return ::recv(fd, b.data(), b.size(), 0); },
//                  [&](const std::vector<std::string>& cmd) { return send(answer(cmd)); });
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "kvtier/resp/parser.hpp"

namespace kvtier::test {

template <class Read, class OnCommand>
void serve_commands(Read read, OnCommand on) {
  resp::parser p;
  for (;;) {
    std::span<std::byte> into = p.prepare();
    const auto n = read(into);
    if (n <= 0) return;
    p.commit(static_cast<std::size_t>(n));
    std::error_code ec;
    while (auto v = p.next(ec)) {
      std::vector<std::string> cmd;
      for (const auto& e : v->elements) cmd.push_back(e.str);
      if (cmd.empty() || !on(cmd)) return;
    }
    if (ec) return;
  }
}

}  // namespace kvtier::test
