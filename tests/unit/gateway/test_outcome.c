/*
 * test_outcome.c — gateway/outcome.c: the cache outcomes as the README defines them.
 */
#include "outcome.h"
#include "pc_test.h"

PC_TEST(definitions)
{
    /* The whole cached system prompt read, only the new turn uncached: a hit (it used to be
     * printed as "partial" while the dashboard counted it as a hit). */
    ASSERT_EQ(gw_outcome_classify(1811, 0), GW_OUTCOME_HIT);
    ASSERT_EQ(gw_outcome_classify(1, 0), GW_OUTCOME_HIT);
    ASSERT_EQ(gw_outcome_classify(1811, 40), GW_OUTCOME_PARTIAL);
    ASSERT_EQ(gw_outcome_classify(0, 490), GW_OUTCOME_WRITE);
    ASSERT_EQ(gw_outcome_classify(0, 0), GW_OUTCOME_MISS);
}

PC_TEST(names)
{
    ASSERT_STR_EQ(gw_outcome_name(GW_OUTCOME_HIT), "hit");
    ASSERT_STR_EQ(gw_outcome_name(GW_OUTCOME_PARTIAL), "partial");
    ASSERT_STR_EQ(gw_outcome_name(GW_OUTCOME_WRITE), "write");
    ASSERT_STR_EQ(gw_outcome_name(GW_OUTCOME_MISS), "miss");
    ASSERT_STR_EQ(gw_outcome_name((gw_outcome_t)GW_OUTCOME_COUNT), "?");
}

PC_TEST_MAIN()
