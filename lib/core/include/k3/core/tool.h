// What every k3 command-line tool shares outside flag parsing: the version line
// and the final check that everything written to stdout reached it.
#pragma once

#include <string>

namespace k3 {

// "k3-repack 0.1.0 (git 1a2b3c4d5e6f, Release)". The sha is the checkout's at
// configure time ("unknown" outside a git checkout).
std::string VersionLine(const char* tool);

// Exit status a reader sees when it closed the pipe: as if SIGPIPE had killed us.
inline constexpr int kExitBrokenPipe = 141;

// Flushes stdout. When a write to it failed (now or earlier: the stream's error
// flag is sticky), prints "<tool>: error: writing to stdout: <reason>" and
// returns the exit code of the cause (no-space 6, io 10) unless `rc` already
// reports a failure; a closed pipe (EPIPE) is quiet and returns 141. Otherwise
// returns `rc`.
int FinishStdout(const char* tool, int rc);

}  // namespace k3
