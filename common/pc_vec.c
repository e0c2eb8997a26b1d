/*
 * pc_vec.c — see pc_vec.h.
 */
#include "pc_vec.h"

#include <stdint.h>
#include <string.h>

int pc__vec_reserve(void *basep, size_t *cap, size_t elem, size_t want)
{
    if (want <= *cap)
        return 0;
    size_t n = *cap ? *cap : 8;
    while (n < want) {
        if (n > SIZE_MAX / 2)
            return PC_ERR_NOMEM;
        n *= 2;
    }
    void *base;
    memcpy(&base, basep, sizeof base); /* *basep is a T *: read it without type punning */
    void *p = pc_reallocarray(base, n, elem);
    if (p == NULL)
        return PC_ERR_NOMEM;
    memcpy(basep, &p, sizeof p);
    *cap = n;
    return 0;
}
