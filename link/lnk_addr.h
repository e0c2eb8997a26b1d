/*
 * lnk_addr.h — "HOST:PORT" addresses of the worker link: the syntax shared by the gateway's config
 * check, the worker client (worker_client.h) and `kvgw worker --listen` (worker_server.h).
 *
 * HOST is one of:
 *
 *   an IPv4 address   dotted quad, "10.0.0.5:7001" (inet_pton: no shorthand such as "10.1");
 *   an IPv6 address   in brackets, "[::1]:7001", "[fe80::1%eth0]:7001" (a zone by interface
 *                     name or number);
 *   a host name       "worker-1:7001", "kvgw-worker.prod.svc.cluster.local:7001": RFC 1123
 *                     labels of 1..63 letters, digits and hyphens, neither starting nor ending
 *                     with a hyphen, separated by dots, at most 253 characters, one trailing
 *                     dot allowed; the last label is not all digits (RFC 3696 2: "10.0.0.300"
 *                     is a broken address, not a name). Underscores are refused (RFC 1123).
 *
 * PORT is decimal, 1..65535 (0 only with LNK_ADDR_PORT_ZERO: a listener's "any free port").
 * Nothing is resolved here: a name is only checked; the client resolves it at every connect
 * (uv_getaddrinfo) and the worker once at bind. Numeric hosts come back as a ready sockaddr.
 *
 * Pure functions of their arguments (no libuv, no allocation); any thread.
 */
#ifndef LNK_ADDR_H
#define LNK_ADDR_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* The longest host part: a DNS name of 253 characters plus its trailing dot. The longest
 * "HOST:PORT" string is then LNK_ADDR_MAX - 1 bytes (brackets, colon, 5 digits). */
#define LNK_ADDR_HOST_MAX 254
#define LNK_ADDR_MAX (LNK_ADDR_HOST_MAX + 9)

enum lnk_addr_kind {
    LNK_ADDR_NAME = 1, /* a host name, to be resolved */
    LNK_ADDR_IPV4 = 4,
    LNK_ADDR_IPV6 = 6,
};

/* lnk_addr_parse flags. */
#define LNK_ADDR_PORT_ZERO 1u /* accept port 0 (a listener picks a free port) */

typedef struct lnk_addr {
    int kind;                         /* enum lnk_addr_kind */
    uint16_t port;                    /* host order */
    char host[LNK_ADDR_HOST_MAX + 1]; /* as written, without brackets (IPv6 keeps its zone) */
    struct sockaddr_storage sa;       /* IPV4 / IPV6: the address with the port; zeroed for names */
} lnk_addr_t;

/* Parses hostport into *out. Returns 0, or PC_ERR_INVAL with a one-line reason in err (NUL
 * terminated, truncated to err_len; err may be NULL) that quotes the offending part: no colon,
 * empty host, a port that is not 1..65535, an unbracketed IPv6 address, a malformed IPv6
 * address or zone, a label that is empty, too long, or has a bad character, a name too long,
 * an all-numeric last label. *out is unspecified on failure. */
int lnk_addr_parse(const char *hostport, unsigned flags, lnk_addr_t *out, char *err,
                   size_t err_len);

/* Checks host (NUL terminated, no brackets, no port) as a host name by the rules above.
 * Returns 0, or PC_ERR_INVAL with a reason in err (may be NULL). */
int lnk_addr_check_name(const char *host, char *err, size_t err_len);

#endif
