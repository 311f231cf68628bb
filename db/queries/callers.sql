-- name: GetCallerByAPIKeyHash :one
SELECT * FROM callers WHERE api_key_hash = @api_key_hash;

-- name: UpsertCaller :exec
-- Seeds a caller (the demo callers at start-up). Re-running it is harmless.
INSERT INTO callers (id, name, api_key_hash)
VALUES (@id, @name, @api_key_hash)
ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, api_key_hash = EXCLUDED.api_key_hash;

-- name: ListCallers :many
SELECT * FROM callers ORDER BY id;

-- name: CreateCaller :one
-- A new caller (server callers add). An existing id is left alone: no
-- row, and the command says so, rather than replacing that caller's key.
INSERT INTO callers (id, name, api_key_hash, webhook_url)
VALUES (@id, @name, @api_key_hash, sqlc.narg(webhook_url))
ON CONFLICT (id) DO NOTHING
RETURNING webhook_secret;

-- name: GetCallerWebhookSecret :one
SELECT webhook_secret FROM callers WHERE id = @id;
