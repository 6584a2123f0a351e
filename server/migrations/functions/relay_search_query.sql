-- A parsed query as one reader's entries are matched: every lexeme prefixed with the reader's id,
-- as relay_search_words stores them. A lexeme left unprefixed could match no entry at all, so the
-- rewrite can narrow a search but never widen it past the reader.
create or replace function relay_search_query(reader bigint, query tsquery)
 returns tsquery
 language sql
 immutable
 parallel safe
as $function$
    select regexp_replace(query::text, '''((?:[^'']|'''')*)''', '''' || reader || ':\1''', 'g')::tsquery
$function$;
