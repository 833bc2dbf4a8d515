-- agent_by_name
SELECT agents.id, agents.name, agents.owner_user_id, agents.model, agents.system_prompt, agents.max_rounds, agents.max_tokens_per_day, agents.allowed_tools, agents.created_at, agents.policy_mode, agents.compact_max_ctx, agents.destructive_policy 
FROM agents 
WHERE agents.name = $1::VARCHAR;

-- get_mission
SELECT missions.id, missions.agent_id, missions.objective, missions.cron, missions.timezone, missions.status, missions.next_run_at, missions.lease_owner, missions.lease_expires_at, missions.deadline, missions.last_error, missions.created_at, missions.updated_at, missions.catch_up, missions.catch_up_window, agents.name AS agent, (SELECT count(*) AS count_1 
FROM mission_iterations 
WHERE mission_iterations.mission_id = missions.id) AS iterations 
FROM missions JOIN agents ON agents.id = missions.agent_id 
WHERE missions.id = $1::BIGINT;

-- list_agents
SELECT agents.id, agents.name, agents.owner_user_id, agents.model, agents.system_prompt, agents.max_rounds, agents.max_tokens_per_day, agents.allowed_tools, agents.created_at, agents.policy_mode, agents.compact_max_ctx, agents.destructive_policy 
FROM agents ORDER BY agents.name;

-- list_iterations
SELECT mission_iterations.id, mission_iterations.mission_id, mission_iterations.scheduled_for, mission_iterations.status, mission_iterations.attempt, mission_iterations.reminders, mission_iterations.attempts, mission_iterations.rounds, mission_iterations.prompt_tokens, mission_iterations.completion_tokens, mission_iterations.stop_reason, mission_iterations.error, mission_iterations.worker_id, mission_iterations.model, mission_iterations.started_at, mission_iterations.finished_at 
FROM mission_iterations 
WHERE mission_iterations.mission_id = $1::BIGINT ORDER BY mission_iterations.id DESC 
 LIMIT $2::INTEGER;

-- list_missions
SELECT missions.id, missions.agent_id, missions.objective, missions.cron, missions.timezone, missions.status, missions.next_run_at, missions.lease_owner, missions.lease_expires_at, missions.deadline, missions.last_error, missions.created_at, missions.updated_at, missions.catch_up, missions.catch_up_window, agents.name AS agent 
FROM missions JOIN agents ON agents.id = missions.agent_id ORDER BY missions.id DESC 
 LIMIT $1::INTEGER;

-- list_missions
SELECT missions.id, missions.agent_id, missions.objective, missions.cron, missions.timezone, missions.status, missions.next_run_at, missions.lease_owner, missions.lease_expires_at, missions.deadline, missions.last_error, missions.created_at, missions.updated_at, missions.catch_up, missions.catch_up_window, agents.name AS agent, latest.id AS last_iteration_id, latest.status AS last_status, latest.stop_reason AS last_stop_reason, latest.started_at AS last_started_at 
FROM missions JOIN agents ON agents.id = missions.agent_id LEFT OUTER JOIN LATERAL (SELECT mission_iterations.id AS id, mission_iterations.status AS status, mission_iterations.stop_reason AS stop_reason, mission_iterations.started_at AS started_at 
FROM mission_iterations 
WHERE mission_iterations.mission_id = missions.id ORDER BY mission_iterations.id DESC 
 LIMIT $1::INTEGER) AS latest ON true ORDER BY missions.id DESC 
 LIMIT $2::INTEGER;

-- with_mcp_servers
SELECT agent_mcp_servers.agent_id, agent_mcp_servers.name, agent_mcp_servers.transport, agent_mcp_servers.url, agent_mcp_servers.command, agent_mcp_servers.args, agent_mcp_servers.headers, agent_mcp_servers.env, agent_mcp_servers.required, agent_mcp_servers.created_at 
FROM agent_mcp_servers 
WHERE agent_mcp_servers.agent_id IN ($1::BIGINT) ORDER BY agent_mcp_servers.agent_id, agent_mcp_servers.name;
