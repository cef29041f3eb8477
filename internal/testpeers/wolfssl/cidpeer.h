/* What cidserver and cidclient share: address parsing, hex, a clock and
 * the wolfSSL set-up both sides do. Header-only: build.sh compiles each
 * peer from one .c file. */
#ifndef CIDPEER_H
#define CIDPEER_H

#include <wolfssl/options.h>
#include <wolfssl/ssl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifndef WOLFSSL_DTLS13
#error "wolfSSL built without DTLS 1.3 (--enable-dtls13)"
#endif
#ifndef WOLFSSL_DTLS_CID
#error "wolfSSL built without connection IDs (--enable-dtlscid)"
#endif

static inline void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("FATAL ", stdout);
	vprintf(fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
	exit(1);
}

/* parse_addr reads an IPv4 "a.b.c.d:port". */
static inline void parse_addr(const char *s, struct sockaddr_in *sa)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	if (colon == NULL || (size_t)(colon - s) >= sizeof host)
		die("address %s: want a.b.c.d:port", s);
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = 0;
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	sa->sin_port = htons((unsigned short)atoi(colon + 1));
	if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
		die("address %s: want a.b.c.d:port", s);
}

/* fmt_addr writes "a.b.c.d:port" into a static buffer of its own per
 * slot, so two addresses fit in one printf. */
static inline const char *fmt_addr(const struct sockaddr_in *sa, int slot)
{
	static char buf[2][32];
	char host[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &sa->sin_addr, host, sizeof host);
	snprintf(buf[slot & 1], sizeof buf[0], "%s:%u", host, ntohs(sa->sin_port));
	return buf[slot & 1];
}

static inline int same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b)
{
	return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
}

static inline const char *hex(const unsigned char *b, unsigned int n)
{
	static char buf[2 * 255 + 1];
	unsigned int i;
	for (i = 0; i < n && i < 255; i++)
		snprintf(buf + 2 * i, 3, "%02x", b[i]);
	buf[2 * i] = 0;
	return n == 0 ? "-" : buf;
}

static inline long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* next_timeout is when a nonblocking session's retransmission timer fires
 * from now: wolfSSL counts its DTLS timeout in seconds and shortens it to
 * a quarter while DTLS 1.3 waits for an ACK. */
static inline long long next_timeout(WOLFSSL *ssl)
{
	long long ms = (long long)wolfSSL_dtls_get_current_timeout(ssl) * 1000;
	if (wolfSSL_dtls13_use_quick_timeout(ssl))
		ms /= 4;
	return now_ms() + ms;
}

/* print_cids prints both directions' connection IDs as wolfSSL holds
 * them: rx is what the peer writes into records for us, tx what we
 * write. */
static inline void print_cids(WOLFSSL *ssl)
{
	unsigned char b[255];
	unsigned int n = 0;
	if (wolfSSL_dtls_cid_get_rx_size(ssl, &n) != WOLFSSL_SUCCESS ||
	    wolfSSL_dtls_cid_get_rx(ssl, b, sizeof b) != WOLFSSL_SUCCESS)
		n = 0;
	printf(" cid_rx=%s", hex(b, n));
	n = 0;
	if (wolfSSL_dtls_cid_get_tx_size(ssl, &n) != WOLFSSL_SUCCESS ||
	    wolfSSL_dtls_cid_get_tx(ssl, b, sizeof b) != WOLFSSL_SUCCESS)
		n = 0;
	printf(" cid_tx=%s", hex(b, n));
}

/* use_cid turns connection IDs on for ssl and sets the one the peer must
 * use towards us (empty: none, RFC 9146's zero-length CID). */
static inline void use_cid(WOLFSSL *ssl, unsigned char *cid, unsigned int n)
{
	int ret = wolfSSL_dtls_cid_use(ssl);
	if (ret != WOLFSSL_SUCCESS)
		die("wolfSSL_dtls_cid_use: %d", ret);
	ret = wolfSSL_dtls_cid_set(ssl, cid, n);
	if (ret != WOLFSSL_SUCCESS)
		die("wolfSSL_dtls_cid_set(%u bytes): %d (DTLS_CID_MAX_SIZE too small?)", n, ret);
}

static inline const char *err_str(WOLFSSL *ssl, int ret)
{
	static char buf[WOLFSSL_MAX_ERROR_SZ];
	int e = wolfSSL_get_error(ssl, ret);
	wolfSSL_ERR_error_string_n((unsigned long)e, buf, sizeof buf);
	return buf;
}

#endif
