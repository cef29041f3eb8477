/* cidserver: a DTLS 1.3 echo server on wolfSSL with connection IDs, for a
 * service behind cidroute in transparent mode.
 *
 * One unconnected UDP socket serves every session. wolfSSL 5.5.4 leaves
 * telling sessions apart and following a peer's new address to the
 * application (its own socket I/O either drops datagrams from anyone but
 * the first peer or takes every datagram's source, authenticated or not),
 * so this server demultiplexes itself: a unified-header record with the C
 * bit goes to the session whose CID it carries, anything else to the
 * session of its source address, and a handshake record from an unknown
 * address starts a session. A session moves to a new source address only
 * when wolfSSL has decrypted application data from it (RFC 9146 §6,
 * which RFC 9147 §9 applies to DTLS 1.3). Its CID is the ordinal followed
 * by random bytes, cidroute's ordinal-first layout.
 *
 * It answers every message m with "<ordinal>|m" and prints one line per
 * event on stdout:
 *   LISTEN a.b.c.d:port
 *   HANDSHAKE peer=... version=... cid_rx=... cid_tx=...
 *   RECV peer=... data=...
 *   MOVED from=... to=... cid_rx=...
 *   CLOSED peer=...
 *   DROP from=... reason=...
 *   ERROR peer=... ...
 */
#include "cidpeer.h"

#include <wolfssl/wolfcrypt/random.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#define MAX_SESSIONS 256
#define DATAGRAM 65536

struct session {
	WOLFSSL *ssl;
	struct sockaddr_in peer;
	unsigned char cid[255];
	unsigned int cidlen;
	const unsigned char *in; /* the datagram wolfSSL is to read, or NULL */
	int inlen;
	int done;                /* handshake complete */
	long long deadline;      /* retransmission timer, ms */
};

static int fd;
static int ordinal;
static unsigned int cidlen = 8;
static struct session *sessions[MAX_SESSIONS];
static WC_RNG rng;

static int io_recv(WOLFSSL *ssl, char *buf, int sz, void *ctx)
{
	struct session *s = ctx;
	int n;
	(void)ssl;
	if (s->in == NULL)
		return WOLFSSL_CBIO_ERR_WANT_READ;
	n = s->inlen < sz ? s->inlen : sz;
	memcpy(buf, s->in, (size_t)n);
	s->in = NULL;
	return n;
}

static int io_send(WOLFSSL *ssl, char *buf, int sz, void *ctx)
{
	struct session *s = ctx;
	(void)ssl;
	if (sendto(fd, buf, (size_t)sz, 0, (struct sockaddr *)&s->peer, sizeof s->peer) < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return WOLFSSL_CBIO_ERR_WANT_WRITE;
		/* A vanished peer (ICMP unreachable) must not end the session:
		 * it may be back at another address. */
		return sz;
	}
	return sz;
}

static void drop_session(int i)
{
	wolfSSL_free(sessions[i]->ssl);
	free(sessions[i]);
	sessions[i] = NULL;
}

static int new_session(WOLFSSL_CTX *ctx, const struct sockaddr_in *from)
{
	int i;
	struct session *s;
	for (i = 0; i < MAX_SESSIONS && sessions[i] != NULL; i++)
		;
	if (i == MAX_SESSIONS)
		return -1;
	s = calloc(1, sizeof *s);
	if (s == NULL)
		die("out of memory");
	s->ssl = wolfSSL_new(ctx);
	if (s->ssl == NULL)
		die("wolfSSL_new");
	s->peer = *from;
	s->cidlen = cidlen;
	s->cid[0] = (unsigned char)ordinal;
	if (wc_RNG_GenerateBlock(&rng, s->cid + 1, cidlen - 1) != 0)
		die("random CID");
	wolfSSL_SetIOReadCtx(s->ssl, s);
	wolfSSL_SetIOWriteCtx(s->ssl, s);
	wolfSSL_dtls_set_using_nonblock(s->ssl, 1);
	/* Ties the HelloRetryRequest cookie to the address, as wolfSSL's own
	 * socket I/O would. */
	wolfSSL_dtls_set_peer(s->ssl, &s->peer, sizeof s->peer);
	use_cid(s->ssl, s->cid, s->cidlen);
	s->deadline = next_timeout(s->ssl);
	sessions[i] = s;
	return i;
}

/* lookup finds the session of a datagram: by the CID of a unified-header
 * record with the C bit (RFC 9147 §4: first byte 001CSLEE), else by its
 * source address. */
static int lookup(const unsigned char *b, int n, const struct sockaddr_in *from)
{
	int i;
	if (n > 0 && (b[0] & 0xe0) == 0x20 && (b[0] & 0x10)) {
		if ((unsigned int)n < 1 + cidlen)
			return -1;
		for (i = 0; i < MAX_SESSIONS; i++)
			if (sessions[i] != NULL && memcmp(sessions[i]->cid, b + 1, cidlen) == 0)
				return i;
		return -1;
	}
	for (i = 0; i < MAX_SESSIONS; i++)
		if (sessions[i] != NULL && same_addr(&sessions[i]->peer, from))
			return i;
	return -1;
}

/* serve hands one datagram to session i and answers what it decrypts. */
static void serve(int i, const unsigned char *b, int n, const struct sockaddr_in *from)
{
	struct session *s = sessions[i];
	char msg[DATAGRAM];
	char out[DATAGRAM + 8];
	int ret;

	s->in = b;
	s->inlen = n;
	if (!s->done) {
		ret = wolfSSL_accept(s->ssl);
		if (ret != WOLFSSL_SUCCESS) {
			int e = wolfSSL_get_error(s->ssl, ret);
			if (e != WOLFSSL_ERROR_WANT_READ && e != WOLFSSL_ERROR_WANT_WRITE) {
				printf("ERROR peer=%s accept: %d %s\n", fmt_addr(&s->peer, 0), e, err_str(s->ssl, ret));
				drop_session(i);
				return;
			}
			s->deadline = next_timeout(s->ssl);
			return;
		}
		s->done = 1;
		printf("HANDSHAKE peer=%s version=%s", fmt_addr(&s->peer, 0), wolfSSL_get_version(s->ssl));
		print_cids(s->ssl);
		printf("\n");
	}
	for (;;) {
		ret = wolfSSL_read(s->ssl, msg, sizeof msg - 1);
		if (ret > 0) {
			/* Decrypted, so authenticated: the session follows it. */
			if (!same_addr(&s->peer, from)) {
				printf("MOVED from=%s to=%s cid_rx=%s\n", fmt_addr(&s->peer, 0), fmt_addr(from, 1),
				       hex(s->cid, s->cidlen));
				s->peer = *from;
			}
			msg[ret] = 0;
			if (ret > 0 && msg[ret - 1] == '\n')
				msg[ret - 1] = 0;
			printf("RECV peer=%s data=%s\n", fmt_addr(&s->peer, 0), msg);
			snprintf(out, sizeof out, "%d|%s", ordinal, msg);
			if (wolfSSL_write(s->ssl, out, (int)strlen(out)) <= 0)
				printf("ERROR peer=%s write: %s\n", fmt_addr(&s->peer, 0), err_str(s->ssl, -1));
			continue;
		}
		int e = wolfSSL_get_error(s->ssl, ret);
		if (e == WOLFSSL_ERROR_WANT_READ || e == WOLFSSL_ERROR_WANT_WRITE)
			break;
		if (e == WOLFSSL_ERROR_ZERO_RETURN)
			printf("CLOSED peer=%s\n", fmt_addr(&s->peer, 0));
		else
			printf("ERROR peer=%s read: %d %s\n", fmt_addr(&s->peer, 0), e, err_str(s->ssl, ret));
		drop_session(i);
		return;
	}
	s->deadline = next_timeout(s->ssl);
}

static void usage(void)
{
	fputs("usage: cidserver -c cert.pem -k key.pem [-b 127.0.0.1:0] [-o ordinal] [-l cidlen] [-v]\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	const char *bind_to = "127.0.0.1:0", *cert = NULL, *key = NULL;
	struct sockaddr_in sa;
	socklen_t salen = sizeof sa;
	WOLFSSL_CTX *ctx;
	static unsigned char buf[DATAGRAM];
	int opt, i;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((opt = getopt(argc, argv, "b:c:k:o:l:v")) != -1) {
		switch (opt) {
		case 'b': bind_to = optarg; break;
		case 'c': cert = optarg; break;
		case 'k': key = optarg; break;
		case 'o': ordinal = atoi(optarg); break;
		case 'l': cidlen = (unsigned int)atoi(optarg); break;
		case 'v': wolfSSL_Debugging_ON(); break;
		default: usage();
		}
	}
	if (cert == NULL || key == NULL || ordinal < 0 || ordinal > 255 || cidlen < 1 || cidlen > 255)
		usage();

	wolfSSL_Init();
	if (wc_InitRng(&rng) != 0)
		die("wc_InitRng");
	ctx = wolfSSL_CTX_new(wolfDTLSv1_3_server_method());
	if (ctx == NULL)
		die("wolfSSL_CTX_new");
	if (wolfSSL_CTX_use_certificate_file(ctx, cert, WOLFSSL_FILETYPE_PEM) != WOLFSSL_SUCCESS)
		die("certificate %s", cert);
	if (wolfSSL_CTX_use_PrivateKey_file(ctx, key, WOLFSSL_FILETYPE_PEM) != WOLFSSL_SUCCESS)
		die("key %s", key);
	wolfSSL_CTX_SetIORecv(ctx, io_recv);
	wolfSSL_CTX_SetIOSend(ctx, io_send);

	parse_addr(bind_to, &sa);
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
		die("bind %s: %s", bind_to, strerror(errno));
	if (getsockname(fd, (struct sockaddr *)&sa, &salen) != 0)
		die("getsockname: %s", strerror(errno));
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	printf("LISTEN %s\n", fmt_addr(&sa, 0));

	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		long long now = now_ms();
		int wait = 100;
		for (i = 0; i < MAX_SESSIONS; i++)
			if (sessions[i] != NULL && !sessions[i]->done && sessions[i]->deadline - now < wait)
				wait = sessions[i]->deadline - now < 0 ? 0 : (int)(sessions[i]->deadline - now);
		if (poll(&p, 1, wait) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		for (;;) {
			struct sockaddr_in from;
			socklen_t fromlen = sizeof from;
			int n = (int)recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fromlen);
			if (n < 0)
				break;
			i = lookup(buf, n, &from);
			if (i < 0 && n > 0 && buf[0] == 22)
				i = new_session(ctx, &from);
			if (i < 0) {
				printf("DROP from=%s reason=%s first=0x%02x len=%d\n", fmt_addr(&from, 0),
				       (n > 0 && (buf[0] & 0xe0) == 0x20) ? "unknown_cid" : "no_session",
				       n > 0 ? buf[0] : 0, n);
				continue;
			}
			serve(i, buf, n, &from);
		}
		now = now_ms();
		for (i = 0; i < MAX_SESSIONS; i++) {
			struct session *s = sessions[i];
			/* Only the handshake retransmits: wolfSSL doubles the timeout
			 * on every call and gives the session up at its maximum. */
			if (s == NULL || s->done || s->deadline > now)
				continue;
			if (wolfSSL_dtls_got_timeout(s->ssl) != WOLFSSL_SUCCESS) {
				int e = wolfSSL_get_error(s->ssl, -1);
				if (e != WOLFSSL_ERROR_WANT_WRITE) {
					printf("ERROR peer=%s timeout: %d %s\n", fmt_addr(&s->peer, 0), e, err_str(s->ssl, -1));
					drop_session(i);
					continue;
				}
			}
			s->deadline = next_timeout(s->ssl);
		}
	}
}
