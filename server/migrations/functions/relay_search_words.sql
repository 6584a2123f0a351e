-- A message's words as one reader's search entry holds them: each lexeme prefixed with the
-- reader's id (`42:deploy`), positions kept, so that the words index keeps a posting list per
-- reader and word and a search reads only its reader's matches. A word too long to be a lexeme
-- once prefixed (a tsvector's lexemes end below 2,047 bytes) is left out rather than failing the
-- batch it is in.
create or replace function relay_search_words(reader bigint, words tsvector)
 returns tsvector
 language sql
 immutable
 parallel safe
as $function$
    select coalesce(string_agg(
               '''' || reader || ':' || replace(replace(w.lexeme, '\', '\\'), '''', '''''') || ''''
               || coalesce(':' || array_to_string(w.positions, ','), ''),
               ' '), '')::tsvector
    from unnest(words) w
    where octet_length(w.lexeme) + octet_length(reader::text) < 2000
$function$;
