-- name: InsertEvent :exec
INSERT INTO events (caller_id, id, type, data)
VALUES (@caller_id, @id, @type, @data);

-- name: GetEvent :one
SELECT * FROM events
WHERE caller_id = @caller_id AND id = @id;

-- name: ListEvents :many
-- Newest first, keyset pagination as for orders.
SELECT * FROM events
WHERE caller_id = @caller_id
  AND (NOT @has_cursor::boolean
       OR (created_at, id) < (@cursor_created_at::timestamptz, @cursor_id::text))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;
