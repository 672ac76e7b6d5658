/* The one translation unit that compiles Debian's volk.c (libvulkan-volk-dev
 * ships the source, not a library). */
#include <volk.c>
