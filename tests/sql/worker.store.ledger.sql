-- _reserve_many
SELECT reserved, checked_at, recent FROM mana_ai_reserve_tool_call($1, $2, $3, $4, $5);
