/*
 * lnk_addr.c — "HOST:PORT" syntax of the worker link (contract in lnk_addr.h).
 */
#include "lnk_addr.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pc_err.h"

#define LABEL_MAX 63
#define NAME_MAX_CHARS 253 /* without the optional trailing dot */

static bool is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

int lnk_addr_check_name(const char *host, char *err, size_t err_len)
{
    size_t n = strlen(host);
    if (n == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "empty host");
    if (host[n - 1] == '.')
        n--; /* the root: "worker.example." is fully qualified */
    if (n == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "host '%s' has no labels", host);
    if (n > NAME_MAX_CHARS)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "host name of %zu characters (at most %d)",
                           n, NAME_MAX_CHARS);
    size_t start = 0;
    bool last_all_digits = true;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && host[i] != '.') {
            char c = host[i];
            if (!is_alnum(c) && c != '-')
                return pc_err_setf(err, err_len, PC_ERR_INVAL,
                                   "host '%s': character '%c' is not allowed in a host name "
                                   "(letters, digits, '-' and '.')",
                                   host, c >= 0x20 && c < 0x7f ? c : '?');
            continue;
        }
        size_t len = i - start;
        if (len == 0)
            return pc_err_setf(err, err_len, PC_ERR_INVAL, "host '%s' has an empty label", host);
        if (len > LABEL_MAX)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "host '%s': a label of %zu characters (at most %d)", host, len,
                               LABEL_MAX);
        if (host[start] == '-' || host[i - 1] == '-')
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "host '%s': a label starts or ends with '-'", host);
        last_all_digits = true;
        for (size_t j = start; j < i; j++)
            if (host[j] < '0' || host[j] > '9')
                last_all_digits = false;
        start = i + 1;
    }
    if (last_all_digits)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "host '%s' is neither an IPv4 address nor a host name", host);
    return 0;
}

/* "[v6]" or "[v6%zone]" (brackets stripped already) into a sockaddr_in6. */
static int parse_v6(const char *host, uint16_t port, struct sockaddr_in6 *a, char *err,
                    size_t err_len)
{
    char ip[INET6_ADDRSTRLEN + 1];
    const char *pct = strchr(host, '%');
    size_t il = pct ? (size_t)(pct - host) : strlen(host);
    if (il == 0 || il >= sizeof ip)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "'[%s]' is not an IPv6 address", host);
    memcpy(ip, host, il);
    ip[il] = '\0';
    memset(a, 0, sizeof *a);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    if (inet_pton(AF_INET6, ip, &a->sin6_addr) != 1)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "'[%s]' is not an IPv6 address", host);
    if (pct != NULL) {
        const char *zone = pct + 1;
        char *end;
        unsigned long idx = strtoul(zone, &end, 10);
        if (zone[0] >= '0' && zone[0] <= '9' && *end == '\0' && idx <= UINT32_MAX)
            a->sin6_scope_id = (uint32_t)idx;
        else if (zone[0] == '\0' || (a->sin6_scope_id = if_nametoindex(zone)) == 0)
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "'[%s]': no network interface '%s' for the zone", host, zone);
    }
    return 0;
}

int lnk_addr_parse(const char *hostport, unsigned flags, lnk_addr_t *out, char *err, size_t err_len)
{
    if (hostport == NULL || hostport[0] == '\0')
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "empty address (expected HOST:PORT)");
    size_t total = strlen(hostport);
    if (total >= LNK_ADDR_MAX)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "address of %zu characters (at most %d)",
                           total, LNK_ADDR_MAX - 1);
    const char *colon = strrchr(hostport, ':');
    if (colon == NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "'%s' has no port (expected HOST:PORT)",
                           hostport);
    /* The port: 1 to 5 decimal digits, nothing else. */
    const char *ps = colon + 1;
    size_t pl = strlen(ps);
    unsigned long port = 0;
    bool digits = pl > 0 && pl <= 5;
    for (size_t i = 0; digits && i < pl; i++) {
        if (ps[i] < '0' || ps[i] > '9')
            digits = false;
        else
            port = port * 10 + (unsigned long)(ps[i] - '0');
    }
    if (!digits || port > 65535 || (port == 0 && !(flags & LNK_ADDR_PORT_ZERO)))
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "bad port '%s' in '%s' (expected %s..65535)",
                           ps, hostport, (flags & LNK_ADDR_PORT_ZERO) ? "0" : "1");
    const char *h = hostport;
    size_t hl = (size_t)(colon - hostport);
    memset(out, 0, sizeof *out);
    out->port = (uint16_t)port;
    if (hl == 0)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "'%s' has an empty host", hostport);
    if (hl > LNK_ADDR_HOST_MAX)
        return pc_err_setf(err, err_len, PC_ERR_INVAL, "host of %zu characters (at most %d)", hl,
                           LNK_ADDR_HOST_MAX);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return pc_err_setf(err, err_len, PC_ERR_INVAL,
                               "'%s': an IPv6 address goes in brackets, [ADDR]:PORT", hostport);
        memcpy(out->host, h + 1, hl - 2);
        out->host[hl - 2] = '\0';
        out->kind = LNK_ADDR_IPV6;
        return parse_v6(out->host, out->port, (struct sockaddr_in6 *)&out->sa, err, err_len);
    }
    memcpy(out->host, h, hl);
    out->host[hl] = '\0';
    if (memchr(h, ':', hl) != NULL || memchr(h, ']', hl) != NULL)
        return pc_err_setf(err, err_len, PC_ERR_INVAL,
                           "'%s': an IPv6 address goes in brackets, [ADDR]:PORT", hostport);
    struct sockaddr_in *a = (struct sockaddr_in *)&out->sa;
    if (inet_pton(AF_INET, out->host, &a->sin_addr) == 1) {
        a->sin_family = AF_INET;
        a->sin_port = htons(out->port);
        out->kind = LNK_ADDR_IPV4;
        return 0;
    }
    memset(&out->sa, 0, sizeof out->sa);
    int rc = lnk_addr_check_name(out->host, err, err_len);
    if (rc != 0)
        return rc;
    out->kind = LNK_ADDR_NAME;
    return 0;
}
