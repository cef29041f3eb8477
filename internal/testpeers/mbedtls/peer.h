/* Helpers shared by cidserver.c and cidclient.c: flag values, hex, PSK
 * cipher suites and address text in Go's netip.AddrPort form. */
#ifndef CIDROUTE_PEER_H
#define CIDROUTE_PEER_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mbedtls/ssl.h"
#include "mbedtls/ssl_ciphersuites.h"

#if !defined(MBEDTLS_SSL_DTLS_CONNECTION_ID)
#error "Mbed TLS built without MBEDTLS_SSL_DTLS_CONNECTION_ID"
#endif
#if MBEDTLS_TLS_EXT_CID != 54
#error "Mbed TLS without the RFC 9146 patch (connection_id extension is not 54)"
#endif

static inline void die(const char *what)
{
    fprintf(stderr, "%s\n", what);
    exit(2);
}

static inline void die_ret(const char *what, int ret)
{
    fprintf(stderr, "%s: -0x%04x\n", what, (unsigned) -ret);
    exit(2);
}

/* hex2bin decodes s into out (at most max bytes) and returns the length,
 * or -1. */
static inline int hex2bin(const char *s, unsigned char *out, size_t max)
{
    size_t n = strlen(s);
    if (n % 2 != 0 || n / 2 > max) {
        return -1;
    }
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            return -1;
        }
        out[i] = (unsigned char) v;
    }
    return (int) (n / 2);
}

static inline void bin2hex(const unsigned char *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        sprintf(out + 2 * i, "%02x", b[i]);
    }
    out[2 * n] = 0;
}

/* ciphersuites turns "TLS-PSK-WITH-AES-128-CCM-8,TLS-PSK-WITH-..." into the
 * zero-terminated list Mbed TLS takes. */
static inline const int *ciphersuites(const char *names)
{
    static int ids[16];
    char buf[512];
    size_t n = 0;
    snprintf(buf, sizeof(buf), "%s", names);
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        int id = mbedtls_ssl_get_ciphersuite_id(tok);
        if (id == 0 || n == sizeof(ids) / sizeof(ids[0]) - 1) {
            fprintf(stderr, "unknown cipher suite %s\n", tok);
            exit(2);
        }
        ids[n++] = id;
    }
    ids[n] = 0;
    return ids;
}

/* parse_addr reads "1.2.3.4:5" or "[::1]:5". */
static inline int parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[128];
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t) (colon - s) >= sizeof(host)) {
        return -1;
    }
    memcpy(host, s, colon - s);
    host[colon - s] = 0;
    int port = atoi(colon + 1);
    if (port < 0 || port > 65535) {
        return -1;
    }
    memset(ss, 0, sizeof(*ss));
    if (host[0] == '[') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *) ss;
        size_t hl = strlen(host);
        if (hl < 2 || host[hl - 1] != ']') {
            return -1;
        }
        host[hl - 1] = 0;
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1) {
            return -1;
        }
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t) port);
        *len = sizeof(*a);
        return 0;
    }
    struct sockaddr_in *a = (struct sockaddr_in *) ss;
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1) {
        return -1;
    }
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t) port);
    *len = sizeof(*a);
    return 0;
}

/* addr_str writes a in the form Go's netip.AddrPort.String uses. */
static inline const char *addr_str(const struct sockaddr_storage *a, char *out, size_t n)
{
    char host[INET6_ADDRSTRLEN];
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *) a;
        inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
        snprintf(out, n, "[%s]:%u", host, ntohs(v6->sin6_port));
    } else {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *) a;
        inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
        snprintf(out, n, "%s:%u", host, ntohs(v4->sin_port));
    }
    return out;
}

#endif
