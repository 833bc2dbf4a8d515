-- get
SELECT user_policy_settings.user_id, user_policy_settings.destructive_opt_ins, user_policy_settings.rate_limit, user_policy_settings.tool_rate_limits, user_policy_settings.updated_at 
FROM user_policy_settings 
WHERE user_policy_settings.user_id = $1::VARCHAR;
