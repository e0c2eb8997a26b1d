/*
 * pc_json.c — see pc_json.h.
 */
#include "pc_json.h"

#include "pc_err.h"
#include "pc_utf8.h"

int pc_json_string(pc_buf_t *b, const char *str, size_t n, unsigned flags)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    size_t mark = b->len, run = 0, i = 0; /* s[run..i) is the pending unescaped run */
    if (pc_buf_append(b, "\"", 1) != 0)
        goto fail;
    while (i < n) {
        unsigned char c = s[i];
        char esc[8];
        size_t esc_len = 2;
        if (c >= 0x80) {
            size_t l = (flags & PC_JSON_UTF8) ? pc_utf8_seq_len(s + i, n - i) : 1;
            if (l > 0) {
                i += l;
                continue;
            }
            memcpy(esc, "\xEF\xBF\xBD", 3); /* U+FFFD for an invalid byte */
            esc_len = 3;
        } else if (c >= 0x20 && c != '"' && c != '\\') {
            i++;
            continue;
        } else {
            esc[0] = '\\';
            switch (c) {
            case '"':
            case '\\':
                esc[1] = (char)c;
                break;
            case '\n':
                esc[1] = 'n';
                break;
            case '\r':
                esc[1] = 'r';
                break;
            case '\t':
                esc[1] = 't';
                break;
            case '\b':
                esc[1] = 'b';
                break;
            case '\f':
                esc[1] = 'f';
                break;
            default:
                memcpy(esc + 1, "u00", 3);
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                esc_len = 6;
                break;
            }
        }
        if (pc_buf_append(b, str + run, i - run) != 0 || pc_buf_append(b, esc, esc_len) != 0)
            goto fail;
        i++;
        run = i;
    }
    if (pc_buf_append(b, str + run, n - run) != 0 || pc_buf_append(b, "\"", 1) != 0)
        goto fail;
    return 0;
fail:
    b->len = mark;
    return PC_ERR_NOMEM;
}

int pc_json_cstr(pc_buf_t *b, const char *s, unsigned flags)
{
    return pc_json_string(b, s != NULL ? s : "", s != NULL ? strlen(s) : 0, flags);
}
