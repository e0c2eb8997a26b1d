/*
 * test_lnk_addr.c — the worker link's HOST:PORT syntax (link/lnk_addr.c): numeric IPv4, IPv6 in
 * brackets (with zones), RFC 1123 host names and every way to get one wrong, each refusal with a
 * reason that quotes the bad part. Pure: nothing is resolved.
 */
#include <arpa/inet.h>
#include <net/if.h>
#include <string.h>

#include "lnk_addr.h"
#include "pc_err.h"
#include "pc_test.h"

/* Parses s, expects success of the given kind, host and port. */
static void ok(const char *s, unsigned flags, int kind, const char *host, unsigned port)
{
    lnk_addr_t a;
    char err[256] = "";
    int rc = lnk_addr_parse(s, flags, &a, err, sizeof err);
    if (rc != 0)
        PC_TEST__FAIL("'%s' refused: %s", s, err);
    ASSERT_EQ(a.kind, kind);
    ASSERT_STR_EQ(a.host, host);
    ASSERT_EQ(a.port, port);
}

/* Expects a refusal whose reason contains want. */
static void bad(const char *s, unsigned flags, const char *want)
{
    lnk_addr_t a;
    char err[256] = "";
    int rc = lnk_addr_parse(s, flags, &a, err, sizeof err);
    if (rc != PC_ERR_INVAL)
        PC_TEST__FAIL("'%s': rc %d (want PC_ERR_INVAL), kind %d host '%s'", s ? s : "(null)", rc,
                      a.kind, a.host);
    if (strstr(err, want) == NULL)
        PC_TEST__FAIL("'%s': reason '%s' lacks '%s'", s ? s : "(null)", err, want);
}

PC_TEST(numeric)
{
    PC_TEST_CALL(ok("127.0.0.1:7001", 0, LNK_ADDR_IPV4, "127.0.0.1", 7001));
    PC_TEST_CALL(ok("0.0.0.0:1", 0, LNK_ADDR_IPV4, "0.0.0.0", 1));
    PC_TEST_CALL(ok("10.1.2.3:65535", 0, LNK_ADDR_IPV4, "10.1.2.3", 65535));
    PC_TEST_CALL(ok("[::1]:7001", 0, LNK_ADDR_IPV6, "::1", 7001));
    PC_TEST_CALL(ok("[::]:7001", 0, LNK_ADDR_IPV6, "::", 7001));
    PC_TEST_CALL(ok("[2001:db8::5]:80", 0, LNK_ADDR_IPV6, "2001:db8::5", 80));
    PC_TEST_CALL(ok("[::ffff:10.0.0.1]:80", 0, LNK_ADDR_IPV6, "::ffff:10.0.0.1", 80));
    /* The sockaddr is ready to connect to. */
    lnk_addr_t a;
    ASSERT_EQ(lnk_addr_parse("10.0.0.5:7001", 0, &a, NULL, 0), 0);
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)&a.sa;
    ASSERT_EQ(v4->sin_family, AF_INET);
    ASSERT_EQ(ntohs(v4->sin_port), 7001);
    ASSERT_EQ(ntohl(v4->sin_addr.s_addr), 0x0a000005u);
    ASSERT_EQ(lnk_addr_parse("[::1]:7002", 0, &a, NULL, 0), 0);
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)&a.sa;
    ASSERT_EQ(v6->sin6_family, AF_INET6);
    ASSERT_EQ(ntohs(v6->sin6_port), 7002);
    ASSERT_TRUE(IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr));
    /* Zones: by number, or by interface name (lo exists on Linux). */
    ASSERT_EQ(lnk_addr_parse("[fe80::1%3]:80", 0, &a, NULL, 0), 0);
    ASSERT_EQ(((const struct sockaddr_in6 *)&a.sa)->sin6_scope_id, 3);
    ASSERT_STR_EQ(a.host, "fe80::1%3");
    if (if_nametoindex("lo") != 0) {
        ASSERT_EQ(lnk_addr_parse("[fe80::1%lo]:80", 0, &a, NULL, 0), 0);
        ASSERT_EQ(((const struct sockaddr_in6 *)&a.sa)->sin6_scope_id, if_nametoindex("lo"));
    }
    PC_TEST_CALL(bad("[fe80::1%no-such-if0]:80", 0, "no network interface 'no-such-if0'"));
    PC_TEST_CALL(bad("[fe80::1%]:80", 0, "no network interface"));
}

PC_TEST(names)
{
    PC_TEST_CALL(ok("localhost:7001", 0, LNK_ADDR_NAME, "localhost", 7001));
    PC_TEST_CALL(ok("worker-1:7001", 0, LNK_ADDR_NAME, "worker-1", 7001));
    PC_TEST_CALL(ok("kvgw-worker.prod.svc.cluster.local:7001", 0, LNK_ADDR_NAME,
                    "kvgw-worker.prod.svc.cluster.local", 7001));
    PC_TEST_CALL(ok("Worker-A.Example.COM.:1", 0, LNK_ADDR_NAME, "Worker-A.Example.COM.", 1));
    PC_TEST_CALL(ok("no-such-host.invalid:7001", 0, LNK_ADDR_NAME, "no-such-host.invalid", 7001));
    /* RFC 1123 lets a label start with a digit; only an all-numeric last label is refused. */
    PC_TEST_CALL(ok("3com.example:80", 0, LNK_ADDR_NAME, "3com.example", 80));
    PC_TEST_CALL(ok("10.0.0.5.nip.io:80", 0, LNK_ADDR_NAME, "10.0.0.5.nip.io", 80));
    PC_TEST_CALL(ok("a:80", 0, LNK_ADDR_NAME, "a", 80));
    /* The names of a name are not resolved, so nothing of the sockaddr is set. */
    lnk_addr_t a;
    ASSERT_EQ(lnk_addr_parse("worker:7001", 0, &a, NULL, 0), 0);
    ASSERT_EQ(a.sa.ss_family, 0);

    /* Label and name lengths: 63 per label, 253 in all (254 with the root's dot). */
    char host[300], s[600];
    memset(host, 'a', 63);
    strcpy(host + 63, ".example");
    snprintf(s, sizeof s, "%s:80", host);
    PC_TEST_CALL(ok(s, 0, LNK_ADDR_NAME, host, 80));
    memset(host, 'b', 64);
    strcpy(host + 64, ".example");
    snprintf(s, sizeof s, "%s:80", host);
    PC_TEST_CALL(bad(s, 0, "a label of 64 characters (at most 63)"));
    /* 4 labels of 63 + 3 dots = 255 > 253; 3 of 63 + one of 61 = 253. */
    size_t n = 0;
    for (int k = 0; k < 4; k++) {
        size_t len = k < 3 ? 63 : 61;
        memset(host + n, 'c' + k, len);
        n += len;
        host[n++] = '.';
    }
    host[n - 1] = '\0'; /* 253 characters */
    ASSERT_EQ(strlen(host), 253);
    snprintf(s, sizeof s, "%s:80", host);
    PC_TEST_CALL(ok(s, 0, LNK_ADDR_NAME, host, 80));
    snprintf(s, sizeof s, "%s.:80", host); /* fully qualified: 254 with the dot */
    lnk_addr_t b;
    ASSERT_EQ(lnk_addr_parse(s, 0, &b, NULL, 0), 0);
    host[252] = 'x';
    host[253] = 'y';
    host[254] = '\0'; /* 255: "cc..c.dd..d.ee..e.ff..fxy" */
    host[251] = 'f';
    snprintf(s, sizeof s, "%s:80", host);
    PC_TEST_CALL(bad(s, 0, "at most"));
}

PC_TEST(bad_hosts)
{
    PC_TEST_CALL(bad("bad_name:80", 0, "character '_' is not allowed"));
    PC_TEST_CALL(bad("worker 1:80", 0, "character ' '"));
    PC_TEST_CALL(bad("-worker:80", 0, "starts or ends with '-'"));
    PC_TEST_CALL(bad("worker-.example:80", 0, "starts or ends with '-'"));
    PC_TEST_CALL(bad("worker..example:80", 0, "empty label"));
    PC_TEST_CALL(bad(".worker:80", 0, "empty label"));
    PC_TEST_CALL(bad(".:80", 0, "no labels"));
    PC_TEST_CALL(bad("wörker:80", 0, "is not allowed"));
    PC_TEST_CALL(bad("work/er:80", 0, "'/'"));
    /* Broken IPv4 addresses are not names either. */
    PC_TEST_CALL(bad("256.1.1.1:80", 0, "neither an IPv4 address nor a host name"));
    PC_TEST_CALL(bad("10.0.0:80", 0, "neither an IPv4 address nor a host name"));
    PC_TEST_CALL(bad("1234:80", 0, "neither an IPv4 address nor a host name"));
    /* IPv6 needs brackets, and a real address inside them. */
    PC_TEST_CALL(bad("::1:80", 0, "an IPv6 address goes in brackets"));
    PC_TEST_CALL(bad("fe80::1:80", 0, "an IPv6 address goes in brackets"));
    PC_TEST_CALL(bad("[::1:80", 0, "an IPv6 address goes in brackets"));
    PC_TEST_CALL(bad("::1]:80", 0, "an IPv6 address goes in brackets"));
    PC_TEST_CALL(bad("[]:80", 0, "an IPv6 address goes in brackets"));
    PC_TEST_CALL(bad("[worker]:80", 0, "'[worker]' is not an IPv6 address"));
    PC_TEST_CALL(bad("[10.0.0.1]:80", 0, "is not an IPv6 address"));
    PC_TEST_CALL(bad("[::g]:80", 0, "is not an IPv6 address"));
    /* Empty. */
    PC_TEST_CALL(bad("", 0, "empty address"));
    PC_TEST_CALL(bad(NULL, 0, "empty address"));
    PC_TEST_CALL(bad(":7001", 0, "empty host"));
}

PC_TEST(ports)
{
    PC_TEST_CALL(bad("worker", 0, "has no port"));
    PC_TEST_CALL(bad("127.0.0.1", 0, "has no port"));
    PC_TEST_CALL(bad("worker:", 0, "bad port ''"));
    PC_TEST_CALL(bad("worker:0", 0, "bad port '0'"));
    PC_TEST_CALL(bad("worker:65536", 0, "bad port '65536'"));
    PC_TEST_CALL(bad("worker:99999", 0, "expected 1..65535"));
    PC_TEST_CALL(bad("worker:123456", 0, "bad port"));
    PC_TEST_CALL(bad("worker:-1", 0, "bad port '-1'"));
    PC_TEST_CALL(bad("worker:+80", 0, "bad port '+80'"));
    PC_TEST_CALL(bad("worker: 80", 0, "bad port ' 80'"));
    PC_TEST_CALL(bad("worker:80 ", 0, "bad port '80 '"));
    PC_TEST_CALL(bad("worker:0x50", 0, "bad port"));
    PC_TEST_CALL(bad("[::1]:", 0, "bad port"));
    /* Port 0 only for a listener. */
    PC_TEST_CALL(ok("127.0.0.1:0", LNK_ADDR_PORT_ZERO, LNK_ADDR_IPV4, "127.0.0.1", 0));
    PC_TEST_CALL(ok("localhost:0", LNK_ADDR_PORT_ZERO, LNK_ADDR_NAME, "localhost", 0));
    PC_TEST_CALL(bad("worker:65536", LNK_ADDR_PORT_ZERO, "expected 0..65535"));
    PC_TEST_CALL(ok("worker:00080", 0, LNK_ADDR_NAME, "worker", 80));
}

/* The gateway's listen addresses (config `listen:` and `kvgw serve --listen`, LNK_ADDR_PORT_ZERO)
 * and `redis.address` (flags 0) use this parser too: the cases their own parsers once had, some
 * of which those took and this refuses. */
PC_TEST(gateway_addresses)
{
    PC_TEST_CALL(ok("127.0.0.1:8080", LNK_ADDR_PORT_ZERO, LNK_ADDR_IPV4, "127.0.0.1", 8080));
    PC_TEST_CALL(ok("0.0.0.0:0", LNK_ADDR_PORT_ZERO, LNK_ADDR_IPV4, "0.0.0.0", 0));
    PC_TEST_CALL(ok("[::1]:0", LNK_ADDR_PORT_ZERO, LNK_ADDR_IPV6, "::1", 0)); /* no brackets */
    PC_TEST_CALL(ok("[::]:8080", LNK_ADDR_PORT_ZERO, LNK_ADDR_IPV6, "::", 8080));
    PC_TEST_CALL(ok("redis:6379", 0, LNK_ADDR_NAME, "redis", 6379));
    PC_TEST_CALL(bad("nowhere", LNK_ADDR_PORT_ZERO, "'nowhere' has no port (expected HOST:PORT)"));
    PC_TEST_CALL(bad(":8080", LNK_ADDR_PORT_ZERO, "':8080' has an empty host"));
    PC_TEST_CALL(bad("h:99999", LNK_ADDR_PORT_ZERO, "bad port '99999' in 'h:99999'"));
    PC_TEST_CALL(bad("h:-1", LNK_ADDR_PORT_ZERO, "bad port '-1'"));
    PC_TEST_CALL(bad("h:", LNK_ADDR_PORT_ZERO, "bad port ''"));
    PC_TEST_CALL(bad("redis:0", 0, "bad port '0' in 'redis:0' (expected 1..65535)"));
    /* strtol took these: a sign, leading blanks, hex. */
    PC_TEST_CALL(bad("h:+8080", LNK_ADDR_PORT_ZERO, "bad port '+8080'"));
    PC_TEST_CALL(bad("h: 8080", LNK_ADDR_PORT_ZERO, "bad port ' 8080'"));
    PC_TEST_CALL(bad("h:0x1f90", LNK_ADDR_PORT_ZERO, "bad port '0x1f90'"));
    /* An unbracketed IPv6 address was split at its last colon ("::1" port 8080). */
    PC_TEST_CALL(bad("::1:8080", LNK_ADDR_PORT_ZERO, "an IPv6 address goes in brackets"));
    /* Half a bracket was kept as part of the host. */
    PC_TEST_CALL(bad("[::1:8080", LNK_ADDR_PORT_ZERO, "an IPv6 address goes in brackets"));
    PC_TEST_CALL(bad("[::1]", LNK_ADDR_PORT_ZERO, "bad port '1]' in '[::1]'")); /* no port */
    /* Any characters were a host. */
    PC_TEST_CALL(bad("my_host:80", LNK_ADDR_PORT_ZERO, "character '_' is not allowed"));
    PC_TEST_CALL(
        bad("300.1.1.1:80", LNK_ADDR_PORT_ZERO, "neither an IPv4 address nor a host name"));
}

PC_TEST(too_long)
{
    /* An address longer than any valid one is refused before anything is copied. */
    char s[2048];
    memset(s, 'a', sizeof s - 1);
    s[sizeof s - 1] = '\0';
    memcpy(s + sizeof s - 6, ":7001", 5);
    PC_TEST_CALL(bad(s, 0, "address of 2047 characters"));
    /* A host of 255 characters in an address that fits: refused as a host. */
    char h[300];
    memset(h, 'a', 255);
    strcpy(h + 255, ":80");
    PC_TEST_CALL(bad(h, 0, "host of 255 characters"));
    /* Bracketed: the same limit. */
    h[0] = '[';
    strcpy(h + 255, "]:80");
    PC_TEST_CALL(bad(h, 0, "host of 256 characters"));
    /* The name check on its own. */
    char err[128];
    ASSERT_EQ(lnk_addr_check_name("worker-1.example", err, sizeof err), 0);
    ASSERT_EQ(lnk_addr_check_name("", err, sizeof err), PC_ERR_INVAL);
    ASSERT_EQ(lnk_addr_check_name("a..b", NULL, 0), PC_ERR_INVAL);
}

PC_TEST_MAIN()
