/*
 * outcome.c — see outcome.h.
 */
#include "outcome.h"

gw_outcome_t gw_outcome_classify(uint32_t read_tokens, uint32_t write_tokens)
{
    if (read_tokens > 0)
        return write_tokens > 0 ? GW_OUTCOME_PARTIAL : GW_OUTCOME_HIT;
    return write_tokens > 0 ? GW_OUTCOME_WRITE : GW_OUTCOME_MISS;
}

const char *gw_outcome_name(gw_outcome_t o)
{
    static const char *const names[GW_OUTCOME_COUNT] = {"hit", "partial", "write", "miss"};
    return (unsigned)o < GW_OUTCOME_COUNT ? names[o] : "?";
}
