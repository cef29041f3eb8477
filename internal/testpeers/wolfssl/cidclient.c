/* cidclient: a DTLS 1.3 client on wolfSSL with connection IDs that sends
 * each line of its stdin as one record and prints what comes back. The
 * bundled example client sends one message and exits; a test needs a
 * session that lives across a NAT rebinding, which a relay in front of
 * this client's fixed socket plays.
 *
 * Lines on stdout:
 *   HANDSHAKE version=... cid_rx=... cid_tx=...   ("-": none)
 *   RECV data=...
 *   BYE            (stdin closed, close_notify sent)
 *   ERROR ...
 */
#include "cidpeer.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

static void usage(void)
{
	fputs("usage: cidclient -s a.b.c.d:port -A ca.pem [-b a.b.c.d:port] [-l cidlen | -n] [-v]\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	const char *server = NULL, *ca = NULL, *bind_to = "127.0.0.1:0";
	unsigned int cidlen = 0;
	unsigned char cid[255];
	struct sockaddr_in peer, local;
	WOLFSSL_CTX *ctx;
	WOLFSSL *ssl;
	char line[16384], msg[65536];
	size_t have = 0;
	int fd, opt, ret, eof = 0, nocid = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((opt = getopt(argc, argv, "s:A:b:l:nv")) != -1) {
		switch (opt) {
		case 's': server = optarg; break;
		case 'A': ca = optarg; break;
		case 'b': bind_to = optarg; break;
		case 'l': cidlen = (unsigned int)atoi(optarg); break;
		case 'n': nocid = 1; break;
		case 'v': wolfSSL_Debugging_ON(); break;
		default: usage();
		}
	}
	if (server == NULL || ca == NULL || cidlen > 255)
		usage();

	wolfSSL_Init();
	ctx = wolfSSL_CTX_new(wolfDTLSv1_3_client_method());
	if (ctx == NULL)
		die("wolfSSL_CTX_new");
	if (wolfSSL_CTX_load_verify_locations(ctx, ca, NULL) != WOLFSSL_SUCCESS)
		die("CA %s", ca);

	parse_addr(server, &peer);
	parse_addr(bind_to, &local);
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&local, sizeof local) != 0)
		die("bind %s: %s", bind_to, strerror(errno));

	ssl = wolfSSL_new(ctx);
	if (ssl == NULL)
		die("wolfSSL_new");
	/* An unconnected socket with the peer set: wolfSSL's own I/O then
	 * ignores datagrams from anyone else. */
	if (wolfSSL_dtls_set_peer(ssl, &peer, sizeof peer) != WOLFSSL_SUCCESS)
		die("wolfSSL_dtls_set_peer");
	if (wolfSSL_set_fd(ssl, fd) != WOLFSSL_SUCCESS)
		die("wolfSSL_set_fd");
	/* The CID the server writes into records to us: 0xc1, 0xc2, ...
	 * With -n the client does not offer the extension at all, so neither
	 * side uses CIDs. */
	for (unsigned int i = 0; i < cidlen; i++)
		cid[i] = (unsigned char)(0xc1 + i);
	if (!nocid)
		use_cid(ssl, cid, cidlen);

	/* Blocking: wolfSSL retransmits the handshake itself. */
	ret = wolfSSL_connect(ssl);
	if (ret != WOLFSSL_SUCCESS)
		die("connect %s: %s", server, err_str(ssl, ret));
	printf("HANDSHAKE version=%s", wolfSSL_get_version(ssl));
	print_cids(ssl);
	printf("\n");

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	wolfSSL_dtls_set_using_nonblock(ssl, 1);
	while (!eof) {
		struct pollfd p[2] = {{.fd = 0, .events = POLLIN}, {.fd = fd, .events = POLLIN}};
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		if (p[1].revents & (POLLIN | POLLERR)) {
			for (;;) {
				ret = wolfSSL_read(ssl, msg, sizeof msg - 1);
				if (ret > 0) {
					msg[ret] = 0;
					printf("RECV data=%s\n", msg);
					continue;
				}
				int e = wolfSSL_get_error(ssl, ret);
				if (e == WOLFSSL_ERROR_WANT_READ || e == WOLFSSL_ERROR_WANT_WRITE)
					break;
				if (e == WOLFSSL_ERROR_ZERO_RETURN) {
					printf("CLOSED\n");
					return 0;
				}
				printf("ERROR read: %d %s\n", e, err_str(ssl, ret));
				return 1;
			}
		}
		if (p[0].revents & (POLLIN | POLLHUP)) {
			ssize_t n = read(0, line + have, sizeof line - have);
			if (n <= 0) {
				eof = 1;
			} else {
				have += (size_t)n;
			}
			/* One record per complete line, without its newline. */
			for (;;) {
				char *nl = memchr(line, '\n', have);
				if (nl == NULL)
					break;
				int len = (int)(nl - line);
				if (len > 0 && wolfSSL_write(ssl, line, len) != len)
					printf("ERROR write: %s\n", err_str(ssl, -1));
				have -= (size_t)(nl - line) + 1;
				memmove(line, nl + 1, have);
			}
			if (have == sizeof line)
				have = 0;
		}
	}
	wolfSSL_shutdown(ssl);
	printf("BYE\n");
	wolfSSL_free(ssl);
	wolfSSL_CTX_free(ctx);
	wolfSSL_Cleanup();
	return 0;
}
