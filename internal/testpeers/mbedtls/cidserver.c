/*
 * cidserver: a DTLS 1.2 echo server with RFC 9146 connection IDs, written
 * against the Mbed TLS API, for cidroute's interop tests.
 *
 * Unlike ssl_server2, which connects its socket to its first client, it
 * serves every client from one unconnected UDP socket and keeps each
 * session by the CID it issued: a tls12_cid record from a new address
 * continues its session, and once such a record has authenticated, replies
 * go to that address (RFC 9146 §6). Records without a CID are matched by
 * source address (the handshake, and clients that negotiated no CID).
 *
 * The CIDs it issues start with its ordinal, the cidroute ordinal-first
 * layout, so a proxy in front routes a session's records to it.
 *
 * It prints one line per event on stdout, for the tests to read:
 *   LISTEN <addr>
 *   START session=<n> peer=<addr> cid=<hex|-> peer_cid=<hex|-> suite=<name>
 *   MOVED session=<n> from=<addr> to=<addr>
 *   DATA session=<n> peer=<addr> len=<n>
 *   DROP reason=<why> from=<addr> len=<n>
 *   END session=<n> reason=<why>
 * and with -trace 1, before each datagram is handled,
 *   RECV from=<addr> len=<n> type=<content type of its first record>
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "peer.h"

#include "mbedtls/ctr_drbg.h"
#include "mbedtls/entropy.h"
#include "mbedtls/error.h"
#include "mbedtls/net_sockets.h"
#include "mbedtls/ssl_cookie.h"
#include "mbedtls/timing.h"

#define MAX_SESSIONS 256
#define MAX_DATAGRAM 16384

enum { HDR_LEN = 13, CT_HANDSHAKE = 22, CT_TLS12_CID = 25, HS_CLIENT_HELLO = 1 };

struct session {
    int used;
    int established;
    unsigned id;
    mbedtls_ssl_context ssl;
    mbedtls_timing_delay_context timer;
    unsigned char cid[MBEDTLS_SSL_CID_IN_LEN_MAX]; /* the CID this server issued */
    struct sockaddr_storage peer;                  /* where replies go */
    socklen_t peer_len;
    time_t last;
    /* the datagram being handed to Mbed TLS, and where it came from */
    const unsigned char *in;
    size_t in_len;
};

static struct {
    int sock;
    unsigned ordinal;
    size_t cid_len;
    char prefix[64];
    int idle;
    int trace;
    unsigned next_id;
    mbedtls_ssl_config conf;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_entropy_context entropy;
    mbedtls_ssl_cookie_ctx cookies;
    unsigned char psk[64];
    size_t psk_len;
    struct session sessions[MAX_SESSIONS];
} srv;

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void) sig;
    stop = 1;
}

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) {
        return 0;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *) a, *y = (const void *) b;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
    }
    const struct sockaddr_in *x = (const void *) a, *y = (const void *) b;
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
}

static int bio_send(void *ctx, const unsigned char *buf, size_t len)
{
    struct session *s = ctx;
    ssize_t n = sendto(srv.sock, buf, len, 0, (struct sockaddr *) &s->peer, s->peer_len);
    if (n < 0) {
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? MBEDTLS_ERR_SSL_WANT_WRITE
                                                         : MBEDTLS_ERR_NET_SEND_FAILED;
    }
    return (int) n;
}

/* bio_recv hands over the datagram the main loop received for this
 * session, once. */
static int bio_recv(void *ctx, unsigned char *buf, size_t len)
{
    struct session *s = ctx;
    if (s->in == NULL) {
        return MBEDTLS_ERR_SSL_WANT_READ;
    }
    if (s->in_len > len) {
        s->in = NULL;
        return MBEDTLS_ERR_SSL_WANT_READ; /* too big for Mbed TLS: dropped */
    }
    size_t n = s->in_len;
    memcpy(buf, s->in, n);
    s->in = NULL;
    return (int) n;
}

static int psk_cb(void *p, mbedtls_ssl_context *ssl, const unsigned char *id, size_t id_len)
{
    (void) p;
    (void) id;
    (void) id_len;
    return mbedtls_ssl_set_hs_psk(ssl, srv.psk, srv.psk_len);
}

static void end_session(struct session *s, const char *why)
{
    if (s->established) {
        printf("END session=%u reason=%s\n", s->id, why);
    }
    mbedtls_ssl_free(&s->ssl);
    s->used = 0;
}

/* prepare makes s ready for a (new) handshake from its peer. */
static int prepare(struct session *s)
{
    unsigned char id[sizeof(struct sockaddr_storage)];
    size_t id_len;
    if (s->peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *) &s->peer;
        memcpy(id, &a->sin6_addr, 16);
        memcpy(id + 16, &a->sin6_port, 2);
        id_len = 18;
    } else {
        const struct sockaddr_in *a = (const void *) &s->peer;
        memcpy(id, &a->sin_addr, 4);
        memcpy(id + 4, &a->sin_port, 2);
        id_len = 6;
    }
    int ret = mbedtls_ssl_set_client_transport_id(&s->ssl, id, id_len);
    if (ret != 0) {
        return ret;
    }
    return mbedtls_ssl_set_cid(&s->ssl, MBEDTLS_SSL_CID_ENABLED, s->cid, srv.cid_len);
}

static struct session *find_cid(const unsigned char *cid)
{
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = &srv.sessions[i];
        if (s->used && memcmp(s->cid, cid, srv.cid_len) == 0) {
            return s;
        }
    }
    return NULL;
}

static struct session *find_addr(const struct sockaddr_storage *a)
{
    for (int i = 0; i < MAX_SESSIONS; i++) {
        struct session *s = &srv.sessions[i];
        if (s->used && same_addr(&s->peer, a)) {
            return s;
        }
    }
    return NULL;
}

static struct session *new_session(const struct sockaddr_storage *from, socklen_t from_len)
{
    struct session *s = NULL;
    for (int i = 0; i < MAX_SESSIONS && s == NULL; i++) {
        if (!srv.sessions[i].used) {
            s = &srv.sessions[i];
        }
    }
    if (s == NULL) {
        return NULL;
    }
    memset(s, 0, sizeof(*s));
    /* byte 0: the ordinal; the rest random, unique among the sessions */
    do {
        s->cid[0] = (unsigned char) srv.ordinal;
        if (mbedtls_ctr_drbg_random(&srv.drbg, s->cid + 1, srv.cid_len - 1) != 0) {
            return NULL;
        }
    } while (find_cid(s->cid) != NULL);
    s->peer = *from;
    s->peer_len = from_len;
    mbedtls_ssl_init(&s->ssl);
    if (mbedtls_ssl_setup(&s->ssl, &srv.conf) != 0) {
        mbedtls_ssl_free(&s->ssl);
        return NULL;
    }
    mbedtls_ssl_set_bio(&s->ssl, s, bio_send, bio_recv, NULL);
    mbedtls_ssl_set_timer_cb(&s->ssl, &s->timer, mbedtls_timing_set_delay, mbedtls_timing_get_delay);
    if (prepare(s) != 0) {
        mbedtls_ssl_free(&s->ssl);
        return NULL;
    }
    s->used = 1;
    s->id = ++srv.next_id;
    s->last = time(NULL);
    return s;
}

/* serve reads what Mbed TLS has for an established session: echoes
 * application data, follows the peer to the source of an authenticated
 * record. */
static void serve(struct session *s, const struct sockaddr_storage *from, socklen_t from_len)
{
    unsigned char buf[MAX_DATAGRAM];
    char a[64], b[64];
    size_t plen = strlen(srv.prefix);
    for (;;) {
        int ret = mbedtls_ssl_read(&s->ssl, buf + plen, sizeof(buf) - plen);
        if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE) {
            return;
        }
        if (ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || ret == 0) {
            mbedtls_ssl_close_notify(&s->ssl);
            end_session(s, "close_notify");
            return;
        }
        if (ret < 0) {
            char err[128];
            mbedtls_strerror(ret, err, sizeof(err));
            printf("END session=%u reason=error(-0x%04x %s)\n", s->id, (unsigned) -ret, err);
            s->established = 0;
            end_session(s, "error");
            return;
        }
        /* The record authenticated under this session's keys and passed
         * the replay check: its source is now the peer's address. */
        if (from != NULL && !same_addr(&s->peer, from)) {
            printf("MOVED session=%u from=%s to=%s\n", s->id,
                   addr_str(&s->peer, a, sizeof(a)), addr_str(from, b, sizeof(b)));
            s->peer = *from;
            s->peer_len = from_len;
        }
        printf("DATA session=%u peer=%s len=%d\n", s->id, addr_str(&s->peer, a, sizeof(a)), ret);
        memcpy(buf, srv.prefix, plen);
        int w = mbedtls_ssl_write(&s->ssl, buf, plen + (size_t) ret);
        if (w < 0 && w != MBEDTLS_ERR_SSL_WANT_WRITE) {
            printf("END session=%u reason=write(-0x%04x)\n", s->id, (unsigned) -w);
            s->established = 0;
            end_session(s, "error");
            return;
        }
    }
}

/* handshake steps s's handshake; from is NULL for a retransmission timer. */
static void handshake(struct session *s, const struct sockaddr_storage *from, socklen_t from_len)
{
    char a[64];
    int ret = mbedtls_ssl_handshake(&s->ssl);
    if (ret == MBEDTLS_ERR_SSL_HELLO_VERIFY_REQUIRED) {
        /* HelloVerifyRequest sent: wait for the ClientHello with the
         * cookie in a fresh context */
        if (mbedtls_ssl_session_reset(&s->ssl) != 0 || prepare(s) != 0) {
            end_session(s, "reset");
        }
        return;
    }
    if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE) {
        return;
    }
    if (ret != 0) {
        char err[128];
        mbedtls_strerror(ret, err, sizeof(err));
        printf("FAIL session=%u peer=%s handshake -0x%04x %s\n", s->id,
               addr_str(&s->peer, a, sizeof(a)), (unsigned) -ret, err);
        end_session(s, "handshake");
        return;
    }
    s->established = 1;
    int enabled = 0;
    unsigned char peer_cid[MBEDTLS_SSL_CID_OUT_LEN_MAX];
    size_t peer_cid_len = 0;
    mbedtls_ssl_get_peer_cid(&s->ssl, &enabled, peer_cid, &peer_cid_len);
    char own[2 * MBEDTLS_SSL_CID_IN_LEN_MAX + 1] = "-", theirs[2 * MBEDTLS_SSL_CID_OUT_LEN_MAX + 1] = "-";
    if (enabled == MBEDTLS_SSL_CID_ENABLED) {
        bin2hex(s->cid, srv.cid_len, own);
        if (peer_cid_len > 0) {
            bin2hex(peer_cid, peer_cid_len, theirs);
        }
    }
    printf("START session=%u peer=%s cid=%s peer_cid=%s suite=%s\n", s->id,
           addr_str(&s->peer, a, sizeof(a)), own, theirs, mbedtls_ssl_get_ciphersuite(&s->ssl));
    serve(s, from, from_len);
}

static void dispatch(const unsigned char *buf, size_t n,
                     const struct sockaddr_storage *from, socklen_t from_len)
{
    char a[64];
    struct session *s = NULL;
    if (srv.trace) {
        printf("RECV from=%s len=%zu type=%u\n", addr_str(from, a, sizeof(a)), n, n > 0 ? buf[0] : 0);
    }
    int is_cid = n >= HDR_LEN + srv.cid_len && buf[0] == CT_TLS12_CID;
    int is_hello = n > HDR_LEN && buf[0] == CT_HANDSHAKE && buf[3] == 0 && buf[4] == 0 &&
                   buf[HDR_LEN] == HS_CLIENT_HELLO;
    if (is_cid) {
        s = find_cid(buf + 11);
        if (s == NULL) {
            printf("DROP reason=unknown_cid from=%s len=%zu\n", addr_str(from, a, sizeof(a)), n);
            return;
        }
    } else {
        s = find_addr(from);
        if (s != NULL && s->established && is_hello) {
            /* a new handshake from an address whose session is done: the
             * client started over (ssl_server2 calls this a reconnect) */
            end_session(s, "new_hello");
            s = NULL;
        }
        if (s == NULL) {
            if (!is_hello) {
                printf("DROP reason=no_session from=%s len=%zu\n", addr_str(from, a, sizeof(a)), n);
                return;
            }
            s = new_session(from, from_len);
            if (s == NULL) {
                printf("DROP reason=full from=%s len=%zu\n", addr_str(from, a, sizeof(a)), n);
                return;
            }
        }
    }
    s->in = buf;
    s->in_len = n;
    s->last = time(NULL);
    if (!s->established) {
        /* during the handshake the session is the address's: nothing has
         * authenticated a move yet, so a CID record from elsewhere is
         * answered where the handshake is */
        handshake(s, from, from_len);
    } else {
        serve(s, from, from_len);
    }
    if (s->used) {
        s->in = NULL;
    }
}

static void usage(void)
{
    die("usage: cidserver [-listen 127.0.0.1:0] [-ordinal 0] [-cid-len 8] [-psk HEX]\n"
        "                 [-ciphersuites TLS-PSK-WITH-AES-128-CCM-8,...] [-prefix TEXT]\n"
        "                 [-idle SECONDS] [-trace 0|1]");
}

int main(int argc, char **argv)
{
    const char *listen = "127.0.0.1:0", *psk = "63696472", *suites =
        "TLS-PSK-WITH-AES-128-CCM-8,TLS-PSK-WITH-AES-128-GCM-SHA256", *prefix = NULL;
    int ordinal = 0, cid_len = 8;
    srv.idle = 300;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 >= argc) {
            usage();
        }
        const char *v = argv[++i];
        if (strcmp(f, "-listen") == 0) {
            listen = v;
        } else if (strcmp(f, "-ordinal") == 0) {
            ordinal = atoi(v);
        } else if (strcmp(f, "-cid-len") == 0) {
            cid_len = atoi(v);
        } else if (strcmp(f, "-psk") == 0) {
            psk = v;
        } else if (strcmp(f, "-ciphersuites") == 0) {
            suites = v;
        } else if (strcmp(f, "-prefix") == 0) {
            prefix = v;
        } else if (strcmp(f, "-idle") == 0) {
            srv.idle = atoi(v);
        } else if (strcmp(f, "-trace") == 0) {
            srv.trace = atoi(v);
        } else {
            usage();
        }
    }
    if (ordinal < 0 || ordinal > 254) {
        die("-ordinal: 0..254 (255 is reserved)");
    }
    if (cid_len < 1 || cid_len > MBEDTLS_SSL_CID_IN_LEN_MAX) {
        die("-cid-len: 1..32");
    }
    srv.ordinal = (unsigned) ordinal;
    srv.cid_len = (size_t) cid_len;
    if (prefix == NULL) {
        snprintf(srv.prefix, sizeof(srv.prefix), "%d|", ordinal);
    } else {
        snprintf(srv.prefix, sizeof(srv.prefix), "%s", prefix);
    }
    int pl = hex2bin(psk, srv.psk, sizeof(srv.psk));
    if (pl <= 0) {
        die("-psk: hex, 1..64 bytes");
    }
    srv.psk_len = (size_t) pl;

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);

    struct sockaddr_storage la;
    socklen_t la_len;
    if (parse_addr(listen, &la, &la_len) != 0) {
        die("-listen: host:port");
    }
    srv.sock = socket(la.ss_family, SOCK_DGRAM, 0);
    if (srv.sock < 0 || bind(srv.sock, (struct sockaddr *) &la, la_len) != 0) {
        perror("bind");
        return 2;
    }
    fcntl(srv.sock, F_SETFL, fcntl(srv.sock, F_GETFL) | O_NONBLOCK);

    int ret;
    mbedtls_entropy_init(&srv.entropy);
    mbedtls_ctr_drbg_init(&srv.drbg);
    if ((ret = mbedtls_ctr_drbg_seed(&srv.drbg, mbedtls_entropy_func, &srv.entropy,
                                     (const unsigned char *) "cidserver", 9)) != 0) {
        die_ret("ctr_drbg_seed", ret);
    }
    mbedtls_ssl_config_init(&srv.conf);
    if ((ret = mbedtls_ssl_config_defaults(&srv.conf, MBEDTLS_SSL_IS_SERVER,
                                           MBEDTLS_SSL_TRANSPORT_DATAGRAM,
                                           MBEDTLS_SSL_PRESET_DEFAULT)) != 0) {
        die_ret("ssl_config_defaults", ret);
    }
    mbedtls_ssl_conf_rng(&srv.conf, mbedtls_ctr_drbg_random, &srv.drbg);
    mbedtls_ssl_conf_ciphersuites(&srv.conf, ciphersuites(suites));
    mbedtls_ssl_conf_psk_cb(&srv.conf, psk_cb, NULL);
    /* The CIDs this server issues have this length; records with another
     * CID are the demultiplexer's business, and it found them a session. */
    if ((ret = mbedtls_ssl_conf_cid(&srv.conf, srv.cid_len, MBEDTLS_SSL_UNEXPECTED_CID_IGNORE)) != 0) {
        die_ret("ssl_conf_cid", ret);
    }
    mbedtls_ssl_cookie_init(&srv.cookies);
    if ((ret = mbedtls_ssl_cookie_setup(&srv.cookies, mbedtls_ctr_drbg_random, &srv.drbg)) != 0) {
        die_ret("ssl_cookie_setup", ret);
    }
    mbedtls_ssl_conf_dtls_cookies(&srv.conf, mbedtls_ssl_cookie_write, mbedtls_ssl_cookie_check,
                                  &srv.cookies);
    mbedtls_ssl_conf_handshake_timeout(&srv.conf, 500, 8000);

    getsockname(srv.sock, (struct sockaddr *) &la, &la_len);
    char a[64];
    printf("LISTEN %s\n", addr_str(&la, a, sizeof(a)));

    static unsigned char buf[MAX_DATAGRAM];
    while (!stop) {
        struct pollfd pfd = { .fd = srv.sock, .events = POLLIN };
        poll(&pfd, 1, 20);
        for (;;) {
            struct sockaddr_storage from;
            socklen_t from_len = sizeof(from);
            ssize_t n = recvfrom(srv.sock, buf, sizeof(buf), 0, (struct sockaddr *) &from, &from_len);
            if (n < 0) {
                break;
            }
            dispatch(buf, (size_t) n, &from, from_len);
        }
        /* handshake retransmissions, idle sessions */
        time_t now = time(NULL);
        for (int i = 0; i < MAX_SESSIONS; i++) {
            struct session *s = &srv.sessions[i];
            if (!s->used) {
                continue;
            }
            if (now - s->last > srv.idle) {
                end_session(s, "idle");
            } else if (!s->established && mbedtls_timing_get_delay(&s->timer) == 2) {
                handshake(s, NULL, 0);
            }
        }
    }
    for (int i = 0; i < MAX_SESSIONS; i++) {
        if (srv.sessions[i].used) {
            if (srv.sessions[i].established) {
                mbedtls_ssl_close_notify(&srv.sessions[i].ssl);
            }
            end_session(&srv.sessions[i], "shutdown");
        }
    }
    return 0;
}
