/*
 * test_config.c — gateway/config.c: the shipped files load, every bad key or value is an error
 * naming the file, line and key path, secrets come from the environment or files, and API keys
 * are kept only as digests.
 */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "config.h"
#include "engine.h"
#include "pc_test.h"
#include "pc_testutil.h"
#include "render.h"

static int parse(const char *yaml, gw_config_t *c, char *err, size_t n)
{
    return gw_config_parse("t.yaml", yaml, strlen(yaml), c, err, n);
}

/* Expects yaml to fail with code and a message containing want. */
static void expect_error(const char *yaml, int code, const char *want)
{
    gw_config_t c;
    char err[512] = "";
    int rc = parse(yaml, &c, err, sizeof err);
    if (rc != code || strstr(err, want) == NULL)
        fprintf(stderr, "  yaml: %s\n  got %d '%s', want %d '%s'\n", yaml, rc, err, code, want);
    ASSERT_EQ(rc, code);
    ASSERT_TRUE(strstr(err, want) != NULL);
}

PC_TEST(shipped_default_matches_builtin)
{
    gw_config_t f, d;
    char err[512];
    int rc = gw_config_load("conf/kvgw.yaml", &f, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(gw_config_default(&d), 0);
    /* The one difference on purpose: the shipped file turns the KV tiers on under var/; the
     * built-in default leaves them off, so a test config gets them only when it asks. */
    ASSERT_TRUE(d.kv_tiers.dir == NULL);
    ASSERT_STR_EQ(f.kv_tiers.dir, "var/kv-tiers");
    ASSERT_EQ_U64(f.kv_tiers.max_bytes, 4ull << 30);
    ASSERT_TRUE(f.kv_tiers.write_through);
    ASSERT_FALSE(f.kv_tiers.has_key);
    d.kv_tiers.dir = pc_strdup("var/kv-tiers");
    pc_buf_t a = {0}, b = {0};
    ASSERT_EQ(gw_config_print(&f, &a), 0);
    ASSERT_EQ(gw_config_print(&d, &b), 0);
    ASSERT_EQ(pc_buf_terminate(&a), 0);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    /* Only the first line (the source) differs. */
    const char *ea = strchr(pc_buf_slice(&a).base, '\n'), *eb = strchr(pc_buf_slice(&b).base, '\n');
    ASSERT_STR_EQ(ea, eb);
    ASSERT_TRUE(strstr(ea, "sk-kvgw") == NULL); /* no key is ever printed */
    ASSERT_TRUE(gw_config_key_find(&f, "sk-kvgw-demo", 12) != NULL);
    ASSERT_STR_EQ(gw_config_key_find(&f, "sk-kvgw-demo2", 13)->tenant, "demo2");
    ASSERT_TRUE(gw_config_key_find(&f, "sk-kvgw-demo3", 13) == NULL);
    ASSERT_TRUE(gw_config_is_admin(&f, "sk-kvgw-admin", 13));
    ASSERT_FALSE(gw_config_is_admin(&f, "sk-kvgw-demo", 12));
    ASSERT_EQ(f.listen_port, 8080);
    ASSERT_STR_EQ(f.models[0].name, "kvgw-demo");
    pc_buf_free(&a);
    pc_buf_free(&b);
    gw_config_free(&f);
    gw_config_free(&d);
}

PC_TEST(cluster_example_loads)
{
    gw_config_t c;
    char err[512];
    setenv("KVGW_LINK_SECRET", "a-link-secret-for-the-test", 1);
    setenv("KVGW_DEMO_KEY", "sk-cluster-demo", 1);
    setenv("KVGW_ADMIN_KEY", "sk-cluster-admin", 1);
    setenv("KVGW_NAMESPACE_SECRET", "a-namespace-secret-for-the-test", 1);
    int rc = gw_config_load("conf/kvgw-cluster.yaml", &c, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(c.models[0].n_remote >= 2);
    ASSERT_STR_EQ(c.link_secret, "a-link-secret-for-the-test");
    ASSERT_FALSE(c.namespace_secret_is_default);
    ASSERT_TRUE(c.redis_host != NULL);
    ASSERT_TRUE(c.registry_enabled);
    ASSERT_TRUE(c.instance_id_set);
    ASSERT_TRUE(gw_config_key_find(&c, "sk-cluster-demo", 15) != NULL);
    ASSERT_TRUE(gw_config_is_admin(&c, "sk-cluster-admin", 16));
    gw_config_free(&c);
}

PC_TEST(units_parse)
{
    uint64_t v;
    ASSERT_EQ(gw_config_parse_duration("250ms", &v), 0);
    ASSERT_EQ_U64(v, 250);
    ASSERT_EQ(gw_config_parse_duration("5m", &v), 0);
    ASSERT_EQ_U64(v, 300000);
    ASSERT_EQ(gw_config_parse_duration("1h", &v), 0);
    ASSERT_EQ_U64(v, 3600000);
    ASSERT_EQ(gw_config_parse_duration("42", &v), 0);
    ASSERT_EQ_U64(v, 42);
    ASSERT_EQ(gw_config_parse_duration("5 minutes", &v), PC_ERR_INVAL);
    ASSERT_EQ(gw_config_parse_duration("-5s", &v), PC_ERR_INVAL);
    ASSERT_EQ(gw_config_parse_duration("", &v), PC_ERR_INVAL);
    ASSERT_EQ(gw_config_parse_size("32MiB", &v), 0);
    ASSERT_EQ_U64(v, 32u << 20);
    ASSERT_EQ(gw_config_parse_size("10MB", &v), 0);
    ASSERT_EQ_U64(v, 10000000);
    ASSERT_EQ(gw_config_parse_size("99999999999999999999GiB", &v), PC_ERR_INVAL);
    ASSERT_EQ(gw_config_parse_size("3 apples", &v), PC_ERR_INVAL);
}

PC_TEST(errors_name_key_and_line)
{
    expect_error("listen: 127.0.0.1:8080\nlimts:\n  max_body_bytes: 1MiB\n", PC_ERR_INVAL,
                 "t.yaml:2: limts: unknown key");
    expect_error("limits:\n  max_body_bytes: lots\n", PC_ERR_INVAL,
                 "t.yaml:2: limits.max_body_bytes: expected a size");
    expect_error("limits:\n  header_timeout: 5 minutes\n", PC_ERR_INVAL,
                 "t.yaml:2: limits.header_timeout: expected a duration");
    /* Addresses by the link's parser (every case in tests/unit/link/test_lnk_addr.c); the
     * reason keeps the file, line and key. */
    expect_error("listen: nowhere\n", PC_ERR_INVAL,
                 "t.yaml:1: listen: 'nowhere' has no port (expected HOST:PORT)");
    expect_error("listen: h:99999\n", PC_ERR_INVAL,
                 "t.yaml:1: listen: bad port '99999' in 'h:99999' (expected 0..65535)");
    expect_error("listen: ::1:8080\n", PC_ERR_INVAL,
                 "t.yaml:1: listen: '::1:8080': an IPv6 address goes in brackets");
    expect_error("redis:\n  address: 'redis:0'\n", PC_ERR_INVAL,
                 "t.yaml:2: redis.address: bad port '0' in 'redis:0' (expected 1..65535)");
    expect_error("redis:\n  address: [x\n", PC_ERR_FORMAT, "t.yaml:");
    expect_error("redis:\n  address: {a: b}\n", PC_ERR_INVAL,
                 "t.yaml:2: redis.address: expected HOST:PORT");
    expect_error("cache:\n  accounting: approximate\n", PC_ERR_INVAL,
                 "t.yaml:2: cache.accounting: expected token or anthropic");
    expect_error("models:\n  - name: m\n    path: m.gguf\n    workers: 1\n    colour: red\n",
                 PC_ERR_INVAL, "t.yaml:5: models[0].colour: unknown key");
    expect_error("models:\n  - name: m\n    path: m.gguf\n", PC_ERR_INVAL,
                 "needs workers (in-process count) or remote");
    expect_error("models:\n  - name: m\n    path: m.gguf\n    workers: 1\n    chat_format: jinja\n",
                 PC_ERR_INVAL,
                 "t.yaml:5: models[0].chat_format: expected one of llama3, chatml, mistral, "
                 "mistral-v1");
    expect_error(
        "models:\n  - {name: m, path: a, workers: 1}\n  - {name: m, path: b, workers: 1}\n",
        PC_ERR_INVAL, "appears twice");
    expect_error("models:\n  - {name: m, path: a, workers: 1, auto_cache_ttl: 10m}\n", PC_ERR_INVAL,
                 "must be 5m or 1h");
    expect_error("api_keys:\n  - {key: abc}\n", PC_ERR_INVAL, "needs key and tenant");
    expect_error("api_keys:\n  - {key: a, tenant: t}\n  - {key: a, tenant: u}\n", PC_ERR_INVAL,
                 "the same key appears twice");
    expect_error("api_keys:\n  - {key: 'sha256:abcd', tenant: t}\n", PC_ERR_INVAL, "64 hex digits");
    expect_error("billing:\n  fsync: sometimes\n", PC_ERR_INVAL, "expected always, batch or off");
    expect_error("billing:\n  verify_on_open: quick\n", PC_ERR_INVAL, "expected index or full");
    expect_error("cache:\n  namespace_secret: short\n", PC_ERR_INVAL, "at least 16 characters");
    expect_error("listen: [unclosed\n", PC_ERR_FORMAT, "t.yaml:");
    expect_error("- a\n- b\n", PC_ERR_INVAL, "expected a mapping");
}

PC_TEST(secrets_from_env_and_files)
{
    const char *path = pc_test_tmp_path("kvgw-secret");
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("  sk-from-file \n", f);
    fclose(f);
    setenv("KVGW_TEST_KEY", "sk-from-env", 1);
    unsetenv("KVGW_TEST_MISSING");
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "api_keys:\n  - {key: 'env:KVGW_TEST_KEY', tenant: a}\n"
             "  - {key: 'file:%s', tenant: b, id: filekey}\n"
             "  - {key: 'sha256:%s', tenant: c}\n",
             path, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" /* "" */);
    gw_config_t c;
    char err[512];
    int rc = parse(yaml, &c, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(c.n_keys, 3);
    ASSERT_STR_EQ(gw_config_key_find(&c, "sk-from-env", 11)->tenant, "a");
    ASSERT_STR_EQ(gw_config_key_find(&c, "sk-from-file", 12)->id, "filekey");
    ASSERT_STR_EQ(gw_config_key_find(&c, "", 0)->tenant, "c");
    ASSERT_TRUE(gw_config_key_find(&c, "sk-kvgw-demo", 12) == NULL); /* replaced, not merged */
    gw_config_free(&c);
    remove(path);
    expect_error("api_keys:\n  - {key: 'env:KVGW_TEST_MISSING', tenant: a}\n", PC_ERR_INVAL,
                 "t.yaml:2: api_keys[0].key: environment variable KVGW_TEST_MISSING is not set");
    expect_error("api_keys:\n  - {key: 'file:/nonexistent/kvgw', tenant: a}\n", PC_ERR_INVAL,
                 "cannot read /nonexistent/kvgw");
}

static void write_text(const char *path, const char *text, int mode)
{
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    fclose(f);
    ASSERT_EQ(chmod(path, (mode_t)mode), 0);
}

/* kv_tiers: off by default and with null; on with dir and its keys; every bad value an error;
 * the key file's rules (hex, size, permissions); each in-process worker its own directory. */
PC_TEST(kv_tiers)
{
    gw_config_t c;
    char err[512];
    ASSERT_EQ(parse("log: {level: info}\n", &c, err, sizeof err), 0);
    ASSERT_TRUE(c.kv_tiers.dir == NULL);
    char dir[256];
    ASSERT_EQ(gw_config_tier_dir(&c, &c.models[0], 0, dir, sizeof dir), PC_ERR_STATE);
    gw_config_free(&c);
    ASSERT_EQ(parse("kv_tiers: null\n", &c, err, sizeof err), 0);
    ASSERT_TRUE(c.kv_tiers.dir == NULL);
    gw_config_free(&c);

    const char *key_path = pc_test_tmp_path("tier.key");
    write_text(key_path, "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n",
               0600);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "models:\n  - {name: m1, path: x.gguf, workers: 2}\n"
             "  - {name: 'org/model v2', path: y.gguf, workers: 1}\n"
             "kv_tiers:\n  dir: /srv/tiers\n  max_bytes: 20GiB\n  g2_bytes: 1GiB\n"
             "  write_through: false\n  min_tokens: 256\n  key_file: %s\n",
             key_path);
    int rc = parse(yaml, &c, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_STR_EQ(c.kv_tiers.dir, "/srv/tiers");
    ASSERT_EQ_U64(c.kv_tiers.max_bytes, 20ull << 30);
    ASSERT_EQ_U64(c.kv_tiers.g2_bytes, 1ull << 30);
    ASSERT_FALSE(c.kv_tiers.write_through);
    ASSERT_EQ(c.kv_tiers.min_tokens, 256);
    ASSERT_TRUE(c.kv_tiers.has_key);
    ASSERT_EQ(c.kv_tiers.key[0], 0x00);
    ASSERT_EQ(c.kv_tiers.key[1], 0x11);
    ASSERT_EQ(c.kv_tiers.key[31], 0xff);
    ASSERT_EQ(gw_config_tier_dir(&c, &c.models[0], 1, dir, sizeof dir), 0);
    ASSERT_STR_EQ(dir, "/srv/tiers/m1/w1");
    ASSERT_EQ(gw_config_tier_dir(&c, &c.models[1], 0, dir, sizeof dir), 0);
    ASSERT_TRUE(strncmp(dir, "/srv/tiers/m-", 13) == 0); /* no '/' or ' ' from the name */
    ASSERT_EQ(strlen(dir), 13 + 16 + 3);
    ASSERT_STR_EQ(dir + 13 + 16, "/w0");
    ASSERT_EQ(gw_config_tier_dir(&c, &c.models[0], 0, dir, 12), PC_ERR_RANGE);
    pc_buf_t out = {0};
    ASSERT_EQ(gw_config_print(&c, &out), 0);
    ASSERT_EQ(pc_buf_terminate(&out), 0);
    ASSERT_TRUE(strstr(out.base, "kv_tiers:\n  dir: /srv/tiers\n") != NULL);
    ASSERT_TRUE(strstr(out.base, "00112233") == NULL); /* the key is never printed */
    pc_buf_free(&out);
    gw_config_free(&c);

    expect_error("kv_tiers:\n  max_bytes: 1GiB\n", PC_ERR_INVAL,
                 "t.yaml:1: kv_tiers: needs dir (or kv_tiers: null");
    expect_error("kv_tiers:\n  dir: ''\n", PC_ERR_INVAL,
                 "t.yaml:2: kv_tiers.dir: must not be empty");
    expect_error("kv_tiers:\n  dir: d\n  max_bytes: 1MiB\n", PC_ERR_INVAL,
                 "t.yaml:3: kv_tiers.max_bytes: 1MiB is out of range");
    expect_error("kv_tiers:\n  dir: d\n  write_through: maybe\n", PC_ERR_INVAL,
                 "t.yaml:3: kv_tiers.write_through: expected true or false");
    expect_error("kv_tiers:\n  dir: d\n  min_tokens: -1\n", PC_ERR_INVAL,
                 "kv_tiers.min_tokens: expected an integer");
    expect_error("kv_tiers:\n  dir: d\n  size: 1GiB\n", PC_ERR_INVAL,
                 "t.yaml:3: kv_tiers.size: unknown key");
    expect_error("kv_tiers: [d]\n", PC_ERR_INVAL, "kv_tiers: expected a mapping");
    /* The key file: missing, readable by others, not 64 hex digits. */
    expect_error("kv_tiers:\n  dir: d\n  key_file: /nonexistent/kvgw.key\n", PC_ERR_INVAL,
                 "t.yaml:3: kv_tiers.key_file: cannot read the key file /nonexistent/kvgw.key");
    write_text(key_path, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", 0644);
    snprintf(yaml, sizeof yaml, "kv_tiers:\n  dir: d\n  key_file: %s\n", key_path);
    expect_error(yaml, PC_ERR_INVAL, "(mode 644): chmod 600 it");
    write_text(key_path, "0011", 0600);
    expect_error(yaml, PC_ERR_INVAL, "must hold 64 hexadecimal digits (32 bytes), not 4 bytes");
    write_text(key_path, "zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", 0600);
    expect_error(yaml, PC_ERR_INVAL, "holds something other than hexadecimal digits");
    remove(key_path);
}

/* listen: takes port 0 (any free port) and keeps an IPv6 host without its brackets; a redis
 * host name is kept as written, for hiredis to resolve. */
PC_TEST(addresses)
{
    gw_config_t c;
    char err[512] = "";
    ASSERT_EQ(
        parse("listen: '[::1]:0'\nredis:\n  address: redis-1.example:6380\n", &c, err, sizeof err),
        0);
    ASSERT_STR_EQ(c.listen_host, "::1");
    ASSERT_EQ(c.listen_port, 0);
    ASSERT_STR_EQ(c.redis_host, "redis-1.example");
    ASSERT_EQ(c.redis_port, 6380);
    gw_config_free(&c);
}

/* Redis and the registry: the settings checked together, each naming the line at fault. */
PC_TEST(cluster_checks)
{
#define SECRET "cache:\n  namespace_secret: a-real-namespace-secret\n"
#define INST "billing:\n  instance_id: gw-a\n"
    expect_error("redis:\n  address: r:6379\n  sentinels: [s1:26379]\n  master_name: m\n",
                 PC_ERR_INVAL, "t.yaml:3: redis.sentinels: give either redis.address");
    expect_error("redis:\n  sentinels: [s1:26379, s2:26379]\n", PC_ERR_INVAL,
                 "t.yaml:2: redis.sentinels: needs redis.master_name");
    expect_error("redis:\n  address: r:1\n  master_name: m\n", PC_ERR_INVAL,
                 "t.yaml:3: redis.master_name: only means something with redis.sentinels");
    expect_error("redis:\n  sentinels: [s1:26379, s1:26379]\n  master_name: m\n", PC_ERR_INVAL,
                 "t.yaml:2: redis.sentinels: sentinel s1:26379 appears twice");
    expect_error("redis:\n  sentinels: [s1]\n  master_name: m\n", PC_ERR_INVAL,
                 "t.yaml:2: redis.sentinels: 's1' has no port");
    expect_error("redis:\n  prefix: 'kv:gw'\n", PC_ERR_INVAL,
                 "t.yaml:2: redis.prefix: expected 1-32 characters");
    expect_error("redis:\n  timeout: 1s\n", PC_ERR_INVAL,
                 "t.yaml:1: redis: needs address or sentinels");
    expect_error("registry:\n  enabled: true\n" SECRET INST, PC_ERR_INVAL,
                 "t.yaml:2: registry.enabled: the registry lives in Redis");
    expect_error("registry:\n  enabled: true\nredis:\n  address: r:1\n" INST, PC_ERR_INVAL,
                 "t.yaml:2: registry.enabled: needs cache.namespace_secret");
    expect_error("registry:\n  enabled: true\nredis:\n  address: r:1\n" SECRET, PC_ERR_INVAL,
                 "t.yaml:2: registry.enabled: needs an explicit billing.instance_id");
    expect_error("redis:\n  address: r:1\n" SECRET INST
                 "registry:\n  enabled: true\n  claim_ttl: 1s\n  timeout: 1s\n",
                 PC_ERR_INVAL, "t.yaml:10: registry.timeout: 1000ms must be below");
    expect_error("registry:\n  enabled: yes\n", PC_ERR_INVAL,
                 "t.yaml:2: registry.enabled: expected true or false");
    expect_error("registry:\n  feed_maxlen: 10\n", PC_ERR_INVAL,
                 "t.yaml:2: registry.feed_maxlen: 10 is out of range");
    expect_error("registry:\n  colour: red\n", PC_ERR_INVAL, "t.yaml:2: registry.colour: unknown");
    expect_error("registry:\n  lease: 5s\n  failover_replay: 11m\n", PC_ERR_INVAL,
                 "t.yaml:3: registry.failover_replay:");

    gw_config_t c;
    char err[512] = "";
    /* Off by default (and with registry: null); the defaults of the design. */
    ASSERT_EQ(parse("registry: null\n", &c, err, sizeof err), 0);
    ASSERT_FALSE(c.registry_enabled);
    ASSERT_EQ(c.registry_timeout_ms, 50u);
    ASSERT_EQ(c.registry_claim_ttl_ms, 30000u);
    ASSERT_EQ(c.registry_lease_ms, 10000u);
    ASSERT_EQ(c.registry_feed_maxlen, 100000u);
    ASSERT_EQ(c.registry_replay_max, 65536u);
    ASSERT_EQ(c.registry_failover_replay_ms, 30000u);
    ASSERT_STR_EQ(c.redis_prefix, "kvgw");
    ASSERT_FALSE(c.instance_id_set);
    gw_config_free(&c);
    const char *ok = "redis:\n  sentinels: [s1:26379, '[::1]:26380']\n  master_name: kvgw-main\n"
                     "  prefix: kvgw-test\n" SECRET INST
                     "registry:\n  enabled: true\n  timeout: 20ms\n  replay_max: 1\n"
                     "  failover_replay: 5s\n";
    ASSERT_EQ(parse(ok, &c, err, sizeof err), 0);
    ASSERT_TRUE(c.registry_enabled);
    ASSERT_TRUE(gw_config_has_redis(&c));
    ASSERT_TRUE(c.redis_host == NULL);
    ASSERT_EQ(c.n_redis_sentinels, 2u);
    ASSERT_STR_EQ(c.redis_sentinels[1], "[::1]:26380");
    ASSERT_STR_EQ(c.redis_master_name, "kvgw-main");
    ASSERT_STR_EQ(c.redis_prefix, "kvgw-test");
    ASSERT_EQ(c.registry_timeout_ms, 20u);
    ASSERT_EQ(c.registry_replay_max, 1u);
    ASSERT_EQ(c.registry_failover_replay_ms, 5000u);
    pc_buf_t b = {0};
    ASSERT_EQ(gw_config_print(&c, &b), 0);
    ASSERT_TRUE(strstr(b.base, "  failover_replay: 5000ms\n") != NULL);
    ASSERT_TRUE(strstr(b.base, "sentinels: ['s1:26379', '[::1]:26380']") != NULL);
    ASSERT_TRUE(strstr(b.base, "registry:\n  enabled: true\n  timeout: 20ms\n") != NULL);
    pc_buf_free(&b);
    gw_config_free(&c);
#undef SECRET
#undef INST
}

PC_TEST(ledger_open_check)
{
    gw_config_t c;
    char err[256];
    ASSERT_EQ(parse("listen: 127.0.0.1:1\n", &c, err, sizeof err), 0);
    ASSERT_TRUE(!c.ledger_full_check); /* the default reads by the time index */
    gw_config_free(&c);
    ASSERT_EQ(parse("billing:\n  verify_on_open: full\n", &c, err, sizeof err), 0);
    ASSERT_TRUE(c.ledger_full_check);
    gw_config_free(&c);
    ASSERT_EQ(parse("billing:\n  verify_on_open: index\n", &c, err, sizeof err), 0);
    ASSERT_TRUE(!c.ledger_full_check);
    gw_config_free(&c);
}

PC_TEST(tokenizer_cache_size)
{
    gw_config_t c;
    char err[512] = "";
    ASSERT_EQ(gw_config_default(&c), 0);
    ASSERT_EQ_U64(c.tokenizer_cache_bytes, 64u << 20);
    gw_config_free(&c);
    ASSERT_EQ(parse("cache:\n  tokenizer_cache: 0\n", &c, err, sizeof err), 0);
    ASSERT_EQ_U64(c.tokenizer_cache_bytes, 0);
    gw_config_free(&c);
    ASSERT_EQ(parse("cache:\n  tokenizer_cache: 256MiB\n", &c, err, sizeof err), 0);
    ASSERT_EQ_U64(c.tokenizer_cache_bytes, 256u << 20);
    pc_buf_t b = {0};
    ASSERT_EQ(gw_config_print(&c, &b), 0);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    ASSERT_TRUE(strstr(b.base, "  tokenizer_cache: 268435456\n") != NULL);
    pc_buf_free(&b);
    gw_config_free(&c);
    PC_TEST_CALL(expect_error("cache:\n  tokenizer_cache: lots\n", PC_ERR_INVAL,
                              "t.yaml:2: cache.tokenizer_cache: expected a size"));
    PC_TEST_CALL(expect_error("cache:\n  tokenizer_cache: 2TiB\n", PC_ERR_INVAL,
                              "t.yaml:2: cache.tokenizer_cache: expected a size"));
    PC_TEST_CALL(expect_error("cache:\n  tokenizer_cache: 2048GiB\n", PC_ERR_INVAL,
                              "cache.tokenizer_cache: 2048GiB is out of range"));
}

/* chat_format names a family (engine/render.h) and overrides the template's detection. */
PC_TEST(chat_format_override)
{
    gw_config_t c;
    char err[512] = "";
    ASSERT_EQ(parse("models:\n  - {name: m, path: m.gguf, workers: 1}\n", &c, err, sizeof err), 0);
    ASSERT_EQ(c.models[0].chat_format, ENG_RENDER_FAMILY_UNKNOWN);
    gw_config_free(&c);
    ASSERT_EQ(parse("models:\n  - {name: m, path: m.gguf, workers: 1, chat_format: mistral-v1}\n",
                    &c, err, sizeof err),
              0);
    ASSERT_EQ(c.models[0].chat_format, ENG_RENDER_FAMILY_MISTRAL_V1);
    pc_buf_t b = {0};
    ASSERT_EQ(gw_config_print(&c, &b), 0);
    ASSERT_EQ(pc_buf_terminate(&b), 0);
    ASSERT_TRUE(strstr(b.base, "    chat_format: mistral-v1\n") != NULL);
    pc_buf_free(&b);
    gw_config_free(&c);
}

/* Issue 19 item 8: a string that goes into every ledger record (tenant, key id, model name) and
 * the instance id are refused when the ledger cannot store them, at the value's line; before,
 * check-config passed them and every event of that tenant failed to record. */
PC_TEST(ledger_strings_fit_the_ledger)
{
    char long64[65], ok63[64], yaml[512];
    memset(long64, 't', 64);
    long64[64] = '\0';
    memset(ok63, 't', 63);
    ok63[63] = '\0';
    snprintf(yaml, sizeof yaml, "api_keys:\n  - key: k1\n    tenant: %s\n", long64);
    PC_TEST_CALL(expect_error(yaml, PC_ERR_INVAL,
                              "t.yaml:3: api_keys[0].tenant: is 64 bytes; the billing ledger "
                              "stores at most 63"));
    snprintf(yaml, sizeof yaml,
             "api_keys:\n  - {key: k1, tenant: t}\n  - {key: k2, id: %s, "
             "tenant: t}\n",
             long64);
    PC_TEST_CALL(expect_error(yaml, PC_ERR_INVAL, "t.yaml:3: api_keys[1].id: is 64 bytes"));
    snprintf(yaml, sizeof yaml, "models:\n  - name: %s\n    path: m.gguf\n    workers: 1\n",
             long64);
    PC_TEST_CALL(expect_error(yaml, PC_ERR_INVAL, "t.yaml:2: models[0].name: is 64 bytes"));
    /* Multi-byte UTF-8 counts in bytes: 22 x 3 = 66. */
    char utf8[128] = "";
    for (int i = 0; i < 22; i++)
        strcat(utf8, "\xe2\x82\xac");
    snprintf(yaml, sizeof yaml, "api_keys:\n  - {key: k1, tenant: \"%s\"}\n", utf8);
    PC_TEST_CALL(expect_error(yaml, PC_ERR_INVAL, "api_keys[0].tenant: is 66 bytes"));
    PC_TEST_CALL(expect_error("api_keys:\n  - {key: k1, tenant: \"a\\tb\"}\n", PC_ERR_INVAL,
                              "t.yaml:2: api_keys[0].tenant: holds a control character (byte "
                              "0x09)"));
    PC_TEST_CALL(expect_error("api_keys:\n  - {key: k1, tenant: \"a\\0b\"}\n", PC_ERR_INVAL,
                              "holds a control character (byte 0x00)"));
    PC_TEST_CALL(expect_error("api_keys:\n  - {key: k1, tenant: \"\"}\n", PC_ERR_INVAL,
                              "t.yaml:2: api_keys[0].tenant: must not be empty"));
    PC_TEST_CALL(expect_error("billing:\n  instance_id: gw/1\n", PC_ERR_INVAL,
                              "t.yaml:2: billing.instance_id: expected 1-63 characters"));
    snprintf(yaml, sizeof yaml, "billing:\n  instance_id: %s\n", long64);
    PC_TEST_CALL(expect_error(yaml, PC_ERR_INVAL, "billing.instance_id: expected 1-63"));

    /* 63 bytes, and any printable UTF-8, are fine. */
    gw_config_t c;
    char err[512];
    snprintf(yaml, sizeof yaml,
             "models:\n  - {name: %s, path: m.gguf, workers: 1}\napi_keys:\n  - {key: k1, id: %s, "
             "tenant: %s}\n  - {key: k2, tenant: \"caf\xc3\xa9 \xe2\x82\xac\"}\nbilling:\n  "
             "instance_id: %s\n",
             ok63, ok63, ok63, ok63);
    int rc = parse(yaml, &c, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "  %s\n", err);
    ASSERT_EQ(rc, 0);
    ASSERT_STR_EQ(c.keys[0].tenant, ok63);
    ASSERT_STR_EQ(c.keys[1].tenant, "caf\xc3\xa9 \xe2\x82\xac");
    gw_config_free(&c);
}

/* Issue 19 item 14: protected mode. The built-in demo secrets are refused on any address but
 * loopback unless the config says so; every demo secret still in use is named. */
PC_TEST(demo_secrets_stay_on_loopback)
{
    gw_config_t c;
    char err[512];
    ASSERT_EQ(parse("", &c, err, sizeof err), 0);
    const char *loop[] = {"127.0.0.1", "127.1.2.3", "::1", "localhost"};
    for (size_t i = 0; i < PC_ARRAY_LEN(loop); i++)
        ASSERT_EQ(gw_config_check_exposure(&c, loop[i], err, sizeof err), 0);
    const char *pub[] = {"0.0.0.0",         "::",        "10.0.0.5",         "192.168.1.1",
                         "gateway.example", "128.0.0.1", "127.0.0.1.example"};
    for (size_t i = 0; i < PC_ARRAY_LEN(pub); i++) {
        err[0] = '\0';
        ASSERT_EQ(gw_config_check_exposure(&c, pub[i], err, sizeof err), PC_ERR_INVAL);
        ASSERT_TRUE(strstr(err, pub[i]) != NULL);
    }
    ASSERT_EQ(gw_config_check_exposure(&c, "0.0.0.0", err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "refusing to listen on 0.0.0.0") != NULL);
    ASSERT_TRUE(strstr(err, "cache.namespace_secret") != NULL);
    ASSERT_TRUE(strstr(err, "sk-kvgw-demo,") != NULL);
    ASSERT_TRUE(strstr(err, "sk-kvgw-demo2") != NULL);
    ASSERT_TRUE(strstr(err, "admin_key sk-kvgw-admin") != NULL);
    ASSERT_TRUE(strstr(err, "server.allow_demo_secrets_on_public: true") != NULL);
    /* NULL: the config's own listen (127.0.0.1 by default). */
    ASSERT_EQ(gw_config_check_exposure(&c, NULL, err, sizeof err), 0);
    gw_config_free(&c);

    /* The flag. */
    ASSERT_EQ(parse("listen: 0.0.0.0:8080\nserver:\n  allow_demo_secrets_on_public: true\n", &c,
                    err, sizeof err),
              0);
    ASSERT_EQ(gw_config_check_exposure(&c, NULL, err, sizeof err), 0);
    gw_config_free(&c);
    PC_TEST_CALL(expect_error("server:\n  allow_demo_secrets_on_public: maybe\n", PC_ERR_INVAL,
                              "t.yaml:2: server.allow_demo_secrets_on_public: expected true or "
                              "false"));

    /* Own secrets: fine anywhere; one demo secret left (a key given as its digest) is named. */
    const char *own =
        "listen: 0.0.0.0:8080\napi_keys:\n  - {key: sk-real-1, tenant: a}\n"
        "admin_key: sk-real-admin\ncache:\n  namespace_secret: a-real-namespace-secret\n";
    ASSERT_EQ(parse(own, &c, err, sizeof err), 0);
    ASSERT_EQ(gw_config_check_exposure(&c, NULL, err, sizeof err), 0);
    gw_config_free(&c);
    uint8_t d[32];
    crypto_hash_sha256(d, (const unsigned char *)"sk-kvgw-demo2", 13);
    char hex[65], yaml[512];
    sodium_bin2hex(hex, sizeof hex, d, sizeof d);
    snprintf(yaml, sizeof yaml,
             "api_keys:\n  - {key: 'sha256:%s', tenant: a}\nadmin_key: sk-real-admin\ncache:\n"
             "  namespace_secret: a-real-namespace-secret\n",
             hex);
    ASSERT_EQ(parse(yaml, &c, err, sizeof err), 0);
    ASSERT_EQ(gw_config_check_exposure(&c, "0.0.0.0", err, sizeof err), PC_ERR_INVAL);
    ASSERT_TRUE(strstr(err, "with the demo API key sk-kvgw-demo2:") != NULL);
    ASSERT_TRUE(strstr(err, "namespace_secret") == NULL);
    gw_config_free(&c);
}

/* Issue 19 item 10: /metrics answers to the admin key only (x-api-key or a bearer token), unless
 * metrics.require_key is false; a config without an admin key must say how /metrics is read. */
PC_TEST(metrics_need_the_admin_key)
{
    gw_config_t c;
    char err[512];
    ASSERT_EQ(parse("", &c, err, sizeof err), 0);
    ASSERT_TRUE(c.metrics_require_key);
    ASSERT_EQ(gw_config_metrics_auth(&c, NULL, NULL), 401);
    ASSERT_EQ(gw_config_metrics_auth(&c, NULL, "Basic abc"), 401);
    ASSERT_EQ(gw_config_metrics_auth(&c, "sk-kvgw-demo", NULL), 403);
    ASSERT_EQ(gw_config_metrics_auth(&c, NULL, "Bearer sk-kvgw-demo"), 403);
    ASSERT_EQ(gw_config_metrics_auth(&c, "sk-kvgw-admin", NULL), 0);
    ASSERT_EQ(gw_config_metrics_auth(&c, NULL, "Bearer sk-kvgw-admin"), 0);
    ASSERT_EQ(gw_config_metrics_auth(&c, NULL, "bearer sk-kvgw-admin"), 0);
    gw_config_free(&c);
    ASSERT_EQ(parse("metrics:\n  require_key: false\n", &c, err, sizeof err), 0);
    ASSERT_EQ(gw_config_metrics_auth(&c, NULL, NULL), 0);
    ASSERT_EQ(gw_config_metrics_auth(&c, "wrong", NULL), 0);
    gw_config_free(&c);
    PC_TEST_CALL(expect_error("admin_key: null\n", PC_ERR_INVAL,
                              "metrics.require_key: /metrics needs the admin key, and admin_key is "
                              "null"));
    ASSERT_EQ(parse("admin_key: null\nmetrics:\n  require_key: false\n", &c, err, sizeof err), 0);
    gw_config_free(&c);
    PC_TEST_CALL(expect_error("metrics:\n  require_key: yes please\n", PC_ERR_INVAL,
                              "t.yaml:2: metrics.require_key: expected true or false"));
}

PC_TEST(kv_dtype_per_model)
{
    /* f16 by default; f32 and q8_0 by name, printed back; anything else names the key. */
    gw_config_t c;
    char err[512] = "";
    ASSERT_EQ(parse("models:\n  - {name: a, path: a, workers: 1}\n"
                    "  - {name: b, path: b, workers: 1, kv_dtype: q8_0}\n"
                    "  - {name: c, path: c, workers: 1, kv_dtype: f32}\n",
                    &c, err, sizeof err),
              0);
    ASSERT_EQ(c.models[0].kv_dtype, ENG_KV_F16);
    ASSERT_EQ(c.models[1].kv_dtype, ENG_KV_Q8_0);
    ASSERT_EQ(c.models[2].kv_dtype, ENG_KV_F32);
    pc_buf_t o = {0};
    ASSERT_EQ(gw_config_print(&c, &o), 0);
    ASSERT_EQ(pc_buf_terminate(&o), 0);
    ASSERT_TRUE(strstr(pc_buf_slice(&o).base, "kv_dtype: q8_0") != NULL);
    ASSERT_TRUE(strstr(pc_buf_slice(&o).base, "kv_dtype: f16") != NULL);
    pc_buf_free(&o);
    gw_config_free(&c);
    expect_error("models:\n  - name: m\n    path: m.gguf\n    workers: 1\n    kv_dtype: q4_0\n",
                 PC_ERR_INVAL, "t.yaml:5: models[0].kv_dtype: expected f16, f32 or q8_0");
    expect_error("models:\n  - {name: m, path: a, workers: 1, kv_dtype: [q8_0]}\n", PC_ERR_INVAL,
                 "models[0].kv_dtype: expected f16, f32 or q8_0");
}

PC_TEST(empty_file_is_the_default)
{
    gw_config_t c;
    char err[256];
    ASSERT_EQ(parse("", &c, err, sizeof err), 0);
    ASSERT_EQ(c.n_models, 1);
    ASSERT_EQ(c.n_keys, 2);
    gw_config_free(&c);
}

PC_TEST_MAIN()
