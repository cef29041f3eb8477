/* Shim: the kernel UAPI headers want <asm/types.h>, which Debian keeps in
 * an architecture directory; its content is the generic one everywhere. */
#include <asm-generic/types.h>
