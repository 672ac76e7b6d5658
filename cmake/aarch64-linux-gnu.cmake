# Cross toolchain for aarch64 Linux with Debian's crossbuild-essential-arm64 and
# the arm64 multiarch -dev packages (scripts/test-arm64.sh). Test executables
# run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR, used by ctest).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Headers-only packages (CLI11, doctest) are architecture-independent and live
# in /usr; everything with a library comes from /usr/lib/aarch64-linux-gnu.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# simdjson: see aarch64-simdjson/simdjson-config.cmake.
set(simdjson_DIR ${CMAKE_CURRENT_LIST_DIR}/aarch64-simdjson CACHE PATH "" FORCE)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# -L / : the arm64 loader and libraries of the multiarch packages (libc6:arm64).
# Not /usr/aarch64-linux-gnu: that loader with the multiarch libstdc++/libgomp
# mixes two glibc builds, and pthread_create then spins forever under qemu.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static;-L;/)
