/* Shim for the UAPI headers: the generic definitions. */
#include <asm-generic/posix_types.h>
