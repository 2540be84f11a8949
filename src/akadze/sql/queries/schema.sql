-- Catalog queries that describe the akadze schema as plain, stable text. The
-- test suite compares this description of a freshly migrated database with the
-- committed canonical schema (src/akadze/sql/schema.txt), which proves that the
-- migrations, applied in order from empty, produce exactly that schema.

-- name: schema_columns
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
       a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE n.nspname = 'akadze' AND c.relkind IN ('r', 'p', 'v', 'm')
ORDER BY c.relname, a.attnum

-- name: schema_indexes
SELECT c.relname, pg_get_indexdef(c.oid)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'akadze' AND c.relkind = 'i'
ORDER BY c.relname

-- name: schema_constraints
SELECT t.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k
JOIN pg_class t ON t.oid = k.conrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'akadze'
ORDER BY t.relname, k.conname

-- name: schema_triggers
SELECT c.relname, g.tgname, pg_get_triggerdef(g.oid)
FROM pg_trigger g
JOIN pg_class c ON c.oid = g.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'akadze' AND NOT g.tgisinternal
ORDER BY c.relname, g.tgname

-- name: schema_functions
SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(pg_get_functiondef(p.oid))
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'akadze'
ORDER BY p.proname, 2

-- name: schema_types
SELECT t.typname, string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
FROM pg_type t
JOIN pg_namespace n ON n.oid = t.typnamespace
JOIN pg_enum e ON e.enumtypid = t.oid
WHERE n.nspname = 'akadze'
GROUP BY t.typname
ORDER BY t.typname
