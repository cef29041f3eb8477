/* Shim for the UAPI headers: the generic definitions. */
#include <asm-generic/swab.h>
