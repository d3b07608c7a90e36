// dist/net.h — small facts about this machine's network that the launcher and the process
// groups share.
#pragma once

#include <string>

namespace loom::dist {

// The local address the kernel would use to reach `host` ("" when it cannot resolve it or has
// no route): the address by which the other machines of a job can reach this one.
std::string local_address_toward(const std::string& host);

}  // namespace loom::dist
