/*
 * cidclient: a DTLS 1.2 PSK client with RFC 9146 connection IDs on Mbed
 * TLS, for cidroute's interop tests. ssl_client2 sends its requests back
 * to back; this one sends a line when the test writes one, so a test can
 * rebind or drain between two messages of one session.
 *
 * After the handshake it prints
 *   HANDSHAKE suite=<name> cid=<hex|-> peer_cid=<hex|->
 * (peer_cid: the CID the server issued, which this client's records carry;
 * "-" when none was negotiated). Then, for each line read from stdin, it
 * sends the line as one record and waits -wait ms for the echo (the line,
 * or "<anything>|line"), sending it again up to -tries times:
 *   REPLY sends=<n> <echo>      or      NOREPLY <line>
 * At the end of stdin it sends close_notify and exits 0.
 */
#include <unistd.h>

#include "peer.h"

#include "mbedtls/ctr_drbg.h"
#include "mbedtls/entropy.h"
#include "mbedtls/error.h"
#include "mbedtls/net_sockets.h"
#include "mbedtls/timing.h"

static void usage(void)
{
    die("usage: cidclient -connect HOST:PORT [-psk HEX] [-identity ID] [-cid 1|0]\n"
        "                 [-cid-len 0] [-ciphersuites NAME,...] [-wait MS] [-tries N]\n"
        "                 [-handshake-max MS]");
}

static int suffix(const char *s, size_t n, const char *line)
{
    size_t l = strlen(line);
    if (n == l && memcmp(s, line, l) == 0) {
        return 1;
    }
    return n > l && s[n - l - 1] == '|' && memcmp(s + n - l, line, l) == 0;
}

int main(int argc, char **argv)
{
    const char *connect = NULL, *psk = "63696472", *identity = "mbedtls", *suites =
        "TLS-PSK-WITH-AES-128-CCM-8";
    int use_cid = 1, cid_len = 0, wait_ms = 500, tries = 5, hs_max = 8000;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (i + 1 >= argc) {
            usage();
        }
        const char *v = argv[++i];
        if (strcmp(f, "-connect") == 0) {
            connect = v;
        } else if (strcmp(f, "-psk") == 0) {
            psk = v;
        } else if (strcmp(f, "-identity") == 0) {
            identity = v;
        } else if (strcmp(f, "-cid") == 0) {
            use_cid = atoi(v);
        } else if (strcmp(f, "-cid-len") == 0) {
            cid_len = atoi(v);
        } else if (strcmp(f, "-ciphersuites") == 0) {
            suites = v;
        } else if (strcmp(f, "-wait") == 0) {
            wait_ms = atoi(v);
        } else if (strcmp(f, "-tries") == 0) {
            tries = atoi(v);
        } else if (strcmp(f, "-handshake-max") == 0) {
            hs_max = atoi(v);
        } else {
            usage();
        }
    }
    if (connect == NULL || hs_max < 500 || cid_len < 0 || cid_len > MBEDTLS_SSL_CID_IN_LEN_MAX || tries < 1) {
        usage();
    }
    char host[128], port[8];
    const char *colon = strrchr(connect, ':');
    if (colon == NULL || (size_t) (colon - connect) >= sizeof(host) || strlen(colon + 1) >= sizeof(port)) {
        usage();
    }
    memcpy(host, connect, colon - connect);
    host[colon - connect] = 0;
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    snprintf(port, sizeof(port), "%s", colon + 1);
    unsigned char key[64];
    int key_len = hex2bin(psk, key, sizeof(key));
    if (key_len <= 0) {
        die("-psk: hex, 1..64 bytes");
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    int ret;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_ssl_config conf;
    mbedtls_ssl_context ssl;
    mbedtls_net_context net;
    mbedtls_timing_delay_context timer;
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    mbedtls_ssl_config_init(&conf);
    mbedtls_ssl_init(&ssl);
    mbedtls_net_init(&net);
    if ((ret = mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy,
                                     (const unsigned char *) "cidclient", 9)) != 0) {
        die_ret("ctr_drbg_seed", ret);
    }
    if ((ret = mbedtls_net_connect(&net, host, port, MBEDTLS_NET_PROTO_UDP)) != 0) {
        die_ret("net_connect", ret);
    }
    if ((ret = mbedtls_ssl_config_defaults(&conf, MBEDTLS_SSL_IS_CLIENT,
                                           MBEDTLS_SSL_TRANSPORT_DATAGRAM,
                                           MBEDTLS_SSL_PRESET_DEFAULT)) != 0) {
        die_ret("ssl_config_defaults", ret);
    }
    mbedtls_ssl_conf_rng(&conf, mbedtls_ctr_drbg_random, &drbg);
    mbedtls_ssl_conf_ciphersuites(&conf, ciphersuites(suites));
    if ((ret = mbedtls_ssl_conf_psk(&conf, key, (size_t) key_len, (const unsigned char *) identity,
                                    strlen(identity))) != 0) {
        die_ret("ssl_conf_psk", ret);
    }
    mbedtls_ssl_conf_read_timeout(&conf, (uint32_t) wait_ms);
    /* retransmissions after 0.5 s, 1 s, ... until -handshake-max */
    mbedtls_ssl_conf_handshake_timeout(&conf, 500, (uint32_t) hs_max);
    if ((ret = mbedtls_ssl_conf_cid(&conf, (size_t) cid_len, MBEDTLS_SSL_UNEXPECTED_CID_IGNORE)) != 0) {
        die_ret("ssl_conf_cid", ret);
    }
    if ((ret = mbedtls_ssl_setup(&ssl, &conf)) != 0) {
        die_ret("ssl_setup", ret);
    }
    /* The CID this client issues (its peer puts it in records to this
     * client): usually empty, as a constrained client's is. */
    unsigned char own[MBEDTLS_SSL_CID_IN_LEN_MAX];
    if ((ret = mbedtls_ctr_drbg_random(&drbg, own, sizeof(own))) != 0) {
        die_ret("ctr_drbg_random", ret);
    }
    if ((ret = mbedtls_ssl_set_cid(&ssl, use_cid ? MBEDTLS_SSL_CID_ENABLED : MBEDTLS_SSL_CID_DISABLED,
                                   own, (size_t) cid_len)) != 0) {
        die_ret("ssl_set_cid", ret);
    }
    mbedtls_ssl_set_bio(&ssl, &net, mbedtls_net_send, mbedtls_net_recv, mbedtls_net_recv_timeout);
    mbedtls_ssl_set_timer_cb(&ssl, &timer, mbedtls_timing_set_delay, mbedtls_timing_get_delay);

    while ((ret = mbedtls_ssl_handshake(&ssl)) != 0) {
        if (ret != MBEDTLS_ERR_SSL_WANT_READ && ret != MBEDTLS_ERR_SSL_WANT_WRITE) {
            char err[128];
            mbedtls_strerror(ret, err, sizeof(err));
            printf("HANDSHAKE FAILED -0x%04x %s\n", (unsigned) -ret, err);
            return 1;
        }
    }
    int enabled = 0;
    unsigned char peer_cid[MBEDTLS_SSL_CID_OUT_LEN_MAX];
    size_t peer_cid_len = 0;
    mbedtls_ssl_get_peer_cid(&ssl, &enabled, peer_cid, &peer_cid_len);
    char ours[2 * MBEDTLS_SSL_CID_IN_LEN_MAX + 1] = "-", theirs[2 * MBEDTLS_SSL_CID_OUT_LEN_MAX + 1] = "-";
    if (enabled == MBEDTLS_SSL_CID_ENABLED) {
        if (cid_len > 0) {
            bin2hex(own, (size_t) cid_len, ours);
        }
        if (peer_cid_len > 0) {
            bin2hex(peer_cid, peer_cid_len, theirs);
        }
    }
    printf("HANDSHAKE suite=%s cid=%s peer_cid=%s\n", mbedtls_ssl_get_ciphersuite(&ssl), ours, theirs);

    char line[4096];
    unsigned char reply[4096];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        line[strcspn(line, "\r\n")] = 0;
        int answered = 0;
        for (int send = 1; send <= tries && !answered; send++) {
            do {
                ret = mbedtls_ssl_write(&ssl, (const unsigned char *) line, strlen(line));
            } while (ret == MBEDTLS_ERR_SSL_WANT_WRITE);
            if (ret < 0) {
                printf("ERROR write -0x%04x\n", (unsigned) -ret);
                return 1;
            }
            for (;;) {
                ret = mbedtls_ssl_read(&ssl, reply, sizeof(reply) - 1);
                if (ret == MBEDTLS_ERR_SSL_TIMEOUT) {
                    break; /* send it again */
                }
                if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE) {
                    continue;
                }
                if (ret <= 0) {
                    printf("ERROR read -0x%04x\n", (unsigned) -ret);
                    return 1;
                }
                if (suffix((const char *) reply, (size_t) ret, line)) {
                    reply[ret] = 0;
                    printf("REPLY sends=%d %s\n", send, reply);
                    answered = 1;
                    break;
                }
                /* a late echo of an earlier line: not this one's */
            }
        }
        if (!answered) {
            printf("NOREPLY %s\n", line);
        }
    }
    mbedtls_ssl_close_notify(&ssl);
    printf("CLOSED\n");
    mbedtls_ssl_free(&ssl);
    mbedtls_ssl_config_free(&conf);
    mbedtls_net_free(&net);
    return 0;
}
