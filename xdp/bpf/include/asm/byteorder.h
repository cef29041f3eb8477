/* Shim for the UAPI headers: the byte order of the BPF target (bpfel or
 * bpfeb), which decides the iphdr bitfields' layout. */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#include <linux/byteorder/big_endian.h>
#else
#include <linux/byteorder/little_endian.h>
#endif
