-- idempotency, portable build only: idem_fingerprint in PL/pgSQL, replacing the extension's
-- LANGUAGE c functions of the same signatures (scripts/portable.sh substitutes them; the
-- COMMENT and privilege statements of sql/ apply unchanged).
--
-- A statement-by-statement port of the canonicaliser in core/src/fingerprint.rs (the one the
-- extension calls): same rules, same limits, same error messages with the same byte offsets.
-- The canonical form is bounded by the text's length as there: at most 16 bytes per byte plus
-- 8192 (max_canonical_len), each number's written length computed from its exponent and
-- charged before its digits are written, so '1e60000000' never writes its digits (the text is
-- read to its end and then refused, 54000, if it is JSON).
-- It is iterative, with an explicit stack, so 1024 levels of nesting cost no call depth.
--
-- Time and memory are linear in the text, as in Rust: the canonical pieces (strings, numbers,
-- punctuation, each object member's key) are appended once to an array in input order, and each
-- object keeps only its members' piece ranges, sorted when it closes; the canonical form is
-- assembled once at the end by walking the pieces, each object in its sorted order. Nothing is
-- concatenated onto a growing value but a piece under 256 bytes (a member's key and its number,
-- an array of small values), and a string's escapes are collected as pieces.

CREATE FUNCTION @extschema@.idem_fingerprint(request text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    max_depth CONSTANT integer := 1024;                -- fingerprint.rs MAX_DEPTH
    b        bytea   := @extschema@._idem_utf8('request', request);  -- as the extension reads it
    n        integer := length(b);
    pos      integer := 0;                            -- byte offset, as in the Rust errors
    -- What numbers may add to the text's own length: max_canonical_len(n) - n in fingerprint.rs.
    budget   bigint  := 15::bigint * n + 8192;
    over     boolean := false;                        -- the numbers passed the bound
    reason   text;
    c        integer;
    v        bytea;                                   -- the piece just read (NULL: none)
    -- The canonical pieces in input order.
    txt      bytea[] := '{}';
    np       integer := 0;
    -- The last piece may be extended (by up to 256 bytes) with the next one: false at an
    -- object's start and end, whose pieces bound its members.
    glue     boolean := false;
    -- Objects, numbered as they open: their pieces txt[o_at .. o_end] (the members in input
    -- order), their sorted members s_*[o_mfirst .. o_mlast], the number of the first object
    -- after them.
    no       integer := 0;
    o_at     integer[] := '{}';
    o_end    integer[] := '{}';
    o_mfirst integer[] := '{}';
    o_mlast  integer[] := '{}';
    o_next   integer[] := '{}';
    -- Sorted members of the closed objects, duplicates dropped: their pieces txt[s_st .. s_en]
    -- (key, ':' and value) and the objects within them, numbers s_ob up to s_obend.
    ns       integer := 0;
    s_st     integer[] := '{}';
    s_en     integer[] := '{}';
    s_ob     integer[] := '{}';
    s_obend  integer[] := '{}';
    -- Open containers: kind ('a'/'o'), object number, first pending member, the pending
    -- member's decoded key, first piece and first object.
    top      integer := 0;
    f_kind   text[]  := '{}';
    f_obj    integer[] := '{}';
    f_first  integer[] := '{}';
    f_kdec   bytea[] := '{}';
    f_mst    integer[] := '{}';
    f_mob    integer[] := '{}';
    -- Members of the open objects, innermost last.
    m_dec    bytea[] := '{}';
    m_st     integer[] := '{}';
    m_en     integer[] := '{}';
    m_ob     integer[] := '{}';
    m_obend  integer[] := '{}';
    mcount   integer := 0;
    want_key boolean := false;
    -- Closing an object: its keys, then its members' order.
    t_dec    bytea[];
    t_st     integer[];
    k        integer;
    -- Assembly: a stack of ranges ('r': pieces pos .. endp with the objects m .. mend) and
    -- objects ('o': the next sorted member cur).
    e_kind   text[]  := '{}';
    e_pos    integer[] := '{}';
    e_endp   integer[] := '{}';
    e_m      integer[] := '{}';
    e_mend   integer[] := '{}';
    e_obj    integer[] := '{}';
    e_cur    integer[] := '{}';
    sp       integer;
    id       integer;
    outp     bytea[] := '{}';
    nout     integer := 0;
    canonical bytea;
    -- Strings: the decoded and the escaped text, as pieces when there are escapes.
    dec      bytea;
    enc      bytea;
    d_parts  bytea[];
    e_parts  bytea[];
    nparts   integer;
    start    integer;
    code     integer;
    lo       integer;
    -- Numbers
    neg      boolean;
    digits   text;
    sig      text;
    trimmed  text;
    expo     numeric;
    e        numeric;
    e_neg    boolean;
    sig_len  integer;
    point    numeric;
    plain    numeric;
    growth   numeric;
    word     text;
BEGIN
    <<main>>
    LOOP
        -- A value (or, in an object, a key) is next; whitespace first.
        LOOP
            c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
            EXIT WHEN c NOT IN (32, 9, 10, 13);
            pos := pos + 1;
        END LOOP;
        IF want_key AND c <> 34 THEN
            reason := 'expected a string key in an object';
            EXIT main;
        END IF;

        IF c = 123 OR c = 91 THEN                       -- { or [
            IF top + 1 > max_depth THEN
                RAISE EXCEPTION 'request nests objects and arrays deeper than % levels', max_depth
                    USING ERRCODE = '54000';
            END IF;
            pos := pos + 1;
            top := top + 1;
            f_kind[top] := CASE c WHEN 123 THEN 'o' ELSE 'a' END;
            f_first[top] := mcount + 1;
            IF c = 123 THEN
                no := no + 1;
                f_obj[top] := no;
                o_at[no] := np + 1;
                glue := false;                          -- its members start pieces of their own
            ELSE
                IF glue AND octet_length(txt[np]) < 256 THEN
                    txt[np] := txt[np] || decode('5b', 'hex');
                ELSE
                    np := np + 1;
                    txt[np] := decode('5b', 'hex');
                END IF;
                glue := true;
            END IF;
            LOOP
                c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                EXIT WHEN c NOT IN (32, 9, 10, 13);
                pos := pos + 1;
            END LOOP;
            IF (f_kind[top] = 'o' AND c = 125) OR (f_kind[top] = 'a' AND c = 93) THEN
                pos := pos + 1;
                IF c = 125 THEN                         -- {}: an object without members
                    id := f_obj[top];
                    o_end[id] := np;
                    o_mfirst[id] := ns + 1;
                    o_mlast[id] := ns;
                    o_next[id] := no + 1;
                    glue := false;
                ELSE
                    IF glue AND octet_length(txt[np]) < 256 THEN
                        txt[np] := txt[np] || decode('5d', 'hex');
                    ELSE
                        np := np + 1;
                        txt[np] := decode('5d', 'hex');
                    END IF;
                    glue := true;
                END IF;
                v := NULL;
                top := top - 1;
            ELSE
                want_key := f_kind[top] = 'o';
                CONTINUE main;
            END IF;

        ELSIF c = 34 THEN                               -- a string: decoded and re-escaped
            pos := pos + 1;
            nparts := 0;
            d_parts := '{}';
            e_parts := '{}';
            LOOP
                start := pos;
                LOOP
                    c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                    EXIT WHEN c = 34 OR c = 92 OR c < 32;
                    pos := pos + 1;
                END LOOP;
                IF pos > start THEN
                    nparts := nparts + 1;
                    d_parts[nparts] := substring(b FROM start + 1 FOR pos - start);
                    e_parts[nparts] := d_parts[nparts];
                END IF;
                IF c = 34 THEN
                    pos := pos + 1;
                    EXIT;
                ELSIF c = -1 THEN
                    reason := 'unterminated string';
                    EXIT main;
                ELSIF c <> 92 THEN
                    reason := 'control character in a string';
                    EXIT main;
                END IF;
                -- An escape.
                pos := pos + 1;
                IF pos >= n THEN
                    reason := 'unterminated escape';
                    EXIT main;
                END IF;
                c := get_byte(b, pos);
                pos := pos + 1;
                code := CASE c WHEN 34 THEN 34 WHEN 92 THEN 92 WHEN 47 THEN 47 WHEN 98 THEN 8
                               WHEN 102 THEN 12 WHEN 110 THEN 10 WHEN 114 THEN 13 WHEN 116 THEN 9 END;
                IF c = 117 THEN                         -- \uXXXX, surrogate pairs combined
                    FOR half IN 1..2 LOOP
                        IF pos + 4 > n THEN
                            reason := 'short unicode escape';
                            EXIT main;
                        END IF;
                        IF convert_from(substring(b FROM pos + 1 FOR 4), 'SQL_ASCII') !~ '^[0-9a-fA-F]{4}$' THEN
                            reason := 'invalid unicode escape';
                            EXIT main;
                        END IF;
                        lo := ('x' || lpad(convert_from(substring(b FROM pos + 1 FOR 4), 'SQL_ASCII'), 8, '0'))::bit(32)::integer;
                        pos := pos + 4;
                        IF half = 1 THEN
                            code := lo;
                            IF code BETWEEN 56320 AND 57343 THEN
                                reason := 'low surrogate without a high surrogate';
                                EXIT main;
                            END IF;
                            EXIT WHEN code NOT BETWEEN 55296 AND 56319;
                            IF NOT (pos + 1 < n AND get_byte(b, pos) = 92 AND get_byte(b, pos + 1) = 117) THEN
                                reason := 'high surrogate without a low surrogate';
                                EXIT main;
                            END IF;
                            pos := pos + 2;
                        ELSE
                            IF lo NOT BETWEEN 56320 AND 57343 THEN
                                reason := 'high surrogate without a low surrogate';
                                EXIT main;
                            END IF;
                            code := 65536 + (code - 55296) * 1024 + (lo - 56320);
                        END IF;
                    END LOOP;
                ELSIF code IS NULL THEN
                    reason := 'invalid escape';
                    EXIT main;
                END IF;
                -- The code point's UTF-8 bytes, and serde_json's escape of it.
                v := decode(CASE
                    WHEN code < 128 THEN lpad(to_hex(code), 2, '0')
                    WHEN code < 2048 THEN to_hex(192 + code / 64) || to_hex(128 + code % 64)
                    WHEN code < 65536 THEN to_hex(224 + code / 4096) || to_hex(128 + code / 64 % 64)
                                           || to_hex(128 + code % 64)
                    ELSE to_hex(240 + code / 262144) || to_hex(128 + code / 4096 % 64)
                         || to_hex(128 + code / 64 % 64) || to_hex(128 + code % 64) END, 'hex');
                nparts := nparts + 1;
                d_parts[nparts] := v;
                e_parts[nparts] := CASE code
                    WHEN 34 THEN decode('5c22', 'hex') WHEN 92 THEN decode('5c5c', 'hex')
                    WHEN 8 THEN decode('5c62', 'hex') WHEN 12 THEN decode('5c66', 'hex')
                    WHEN 10 THEN decode('5c6e', 'hex') WHEN 13 THEN decode('5c72', 'hex')
                    WHEN 9 THEN decode('5c74', 'hex')
                    ELSE CASE WHEN code < 32 THEN convert_to('\u00' || lpad(to_hex(code), 2, '0'), 'UTF8')
                              ELSE v END END;
            END LOOP;
            IF nparts <= 1 THEN
                dec := coalesce(d_parts[1], ''::bytea);
                enc := coalesce(e_parts[1], ''::bytea);
            ELSE
                SELECT string_agg(x.d, ''::bytea ORDER BY x.i), string_agg(x.e, ''::bytea ORDER BY x.i)
                  INTO dec, enc
                  FROM unnest(d_parts, e_parts) WITH ORDINALITY AS x(d, e, i);
            END IF;
            IF want_key THEN
                f_kdec[top] := dec;
                want_key := false;
                LOOP
                    c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                    EXIT WHEN c NOT IN (32, 9, 10, 13);
                    pos := pos + 1;
                END LOOP;
                IF c <> 58 THEN
                    reason := 'expected '':'' after an object key';
                    EXIT main;
                END IF;
                pos := pos + 1;
                -- The member's first piece: its key and ':'.
                np := np + 1;
                txt[np] := decode('22', 'hex') || enc || decode('223a', 'hex');
                glue := true;
                f_mst[top] := np;
                f_mob[top] := no + 1;
                CONTINUE main;
            END IF;
            v := decode('22', 'hex') || enc || decode('22', 'hex');

        ELSIF c = 45 OR c BETWEEN 48 AND 57 THEN        -- a number: exact, plain decimal
            neg := c = 45;
            IF neg THEN
                pos := pos + 1;
            END IF;
            start := pos;
            LOOP
                c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                EXIT WHEN c NOT BETWEEN 48 AND 57;
                pos := pos + 1;
            END LOOP;
            IF pos = start OR (pos - start > 1 AND get_byte(b, start) = 48) THEN
                reason := 'invalid number';
                EXIT main;
            END IF;
            digits := convert_from(substring(b FROM start + 1 FOR pos - start), 'SQL_ASCII');
            expo := 0;
            IF c = 46 THEN                              -- .
                pos := pos + 1;
                lo := pos;
                LOOP
                    c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                    EXIT WHEN c NOT BETWEEN 48 AND 57;
                    pos := pos + 1;
                END LOOP;
                IF pos = lo THEN
                    reason := 'invalid number';
                    EXIT main;
                END IF;
                digits := digits || convert_from(substring(b FROM lo + 1 FOR pos - lo), 'SQL_ASCII');
                expo := lo - pos;
            END IF;
            IF c = 101 OR c = 69 THEN                   -- e E
                pos := pos + 1;
                c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                e_neg := c = 45;
                IF c = 45 OR c = 43 THEN
                    pos := pos + 1;
                END IF;
                lo := pos;
                e := 0;
                LOOP
                    c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                    EXIT WHEN c NOT BETWEEN 48 AND 57;
                    -- Past 10^19 the size budget refuses the number anyway (Rust saturates).
                    IF e < 1e19 THEN
                        e := e * 10 + (c - 48);
                    END IF;
                    pos := pos + 1;
                END LOOP;
                IF pos = lo THEN
                    reason := 'invalid number';
                    EXIT main;
                END IF;
                expo := expo + CASE WHEN e_neg THEN -e ELSE e END;
            END IF;
            sig := ltrim(digits, '0');
            IF sig = '' THEN
                v := decode('30', 'hex');
            ELSE
                trimmed := rtrim(sig, '0');
                expo := expo + (length(sig) - length(trimmed));
                sig := trimmed;
                sig_len := length(sig);
                plain := CASE WHEN neg THEN 1 ELSE 0 END   -- the written length, sign included
                         + CASE WHEN expo >= 0 THEN sig_len + expo
                                WHEN sig_len + expo > 0 THEN sig_len + 1
                                ELSE 2 - expo END;
                growth := greatest(plain - (pos - start + CASE WHEN neg THEN 1 ELSE 0 END), 0);
                IF over OR growth > budget THEN
                    -- Nothing more is written; the rest is read, so a text that is not JSON is
                    -- reported as such (the refusal is raised at the end).
                    over := true;
                    v := NULL;
                ELSE
                    budget := budget - growth;
                    point := sig_len + expo;
                    v := convert_to(CASE WHEN neg THEN '-' ELSE '' END || CASE
                             WHEN expo >= 0 THEN sig || repeat('0', expo::integer)
                             WHEN point > 0 THEN substr(sig, 1, point::integer) || '.' || substr(sig, point::integer + 1)
                             ELSE '0.' || repeat('0', (-point)::integer) || sig END, 'UTF8');
                END IF;
            END IF;

        ELSIF c IN (116, 102, 110) THEN                 -- true false null
            word := CASE c WHEN 116 THEN 'true' WHEN 102 THEN 'false' ELSE 'null' END;
            IF substring(b FROM pos + 1 FOR length(word)) <> convert_to(word, 'UTF8') THEN
                reason := 'expected true, false or null';
                EXIT main;
            END IF;
            pos := pos + length(word);
            v := convert_to(word, 'UTF8');

        ELSIF c = -1 THEN
            reason := 'unexpected end of input';
            EXIT main;
        ELSE
            reason := 'expected a value';
            EXIT main;
        END IF;

        -- v is complete: append it, then close every container that ends here.
        IF v IS NOT NULL THEN
            IF glue AND octet_length(txt[np]) < 256 THEN
                txt[np] := txt[np] || v;
            ELSE
                np := np + 1;
                txt[np] := v;
            END IF;
            glue := true;
        END IF;
        LOOP
            IF top = 0 THEN
                LOOP
                    c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                    EXIT WHEN c NOT IN (32, 9, 10, 13);
                    pos := pos + 1;
                END LOOP;
                IF pos <> n THEN
                    reason := 'trailing characters after the value';
                    EXIT main;
                END IF;
                IF over THEN
                    RAISE EXCEPTION 'request''s canonical form would exceed % bytes, the limit for a text of % bytes (16 bytes per byte plus 8192): its numbers'' exponents write out too many digits',
                        16::bigint * n + 8192, n
                        USING ERRCODE = '54000';
                END IF;
                -- Assembly: the pieces in order, each object's members in their sorted order.
                sp := 1;
                e_kind[1] := 'r'; e_pos[1] := 1; e_endp[1] := np; e_m[1] := 1; e_mend[1] := no + 1;
                WHILE sp > 0 LOOP
                    IF e_kind[sp] = 'r' THEN
                        IF e_m[sp] < e_mend[sp] THEN           -- the next object in the range
                            id := e_m[sp];
                            FOR i IN e_pos[sp] .. o_at[id] - 1 LOOP
                                nout := nout + 1;
                                outp[nout] := txt[i];
                            END LOOP;
                            e_pos[sp] := o_end[id] + 1;
                            e_m[sp] := o_next[id];
                            nout := nout + 1;
                            outp[nout] := decode('7b', 'hex');
                            sp := sp + 1;
                            e_kind[sp] := 'o'; e_obj[sp] := id; e_cur[sp] := o_mfirst[id];
                        ELSE
                            FOR i IN e_pos[sp] .. e_endp[sp] LOOP
                                nout := nout + 1;
                                outp[nout] := txt[i];
                            END LOOP;
                            sp := sp - 1;
                        END IF;
                    ELSE
                        id := e_obj[sp];
                        k := e_cur[sp];
                        IF k <= o_mlast[id] THEN               -- the next member, sorted
                            IF k > o_mfirst[id] THEN
                                nout := nout + 1;
                                outp[nout] := decode('2c', 'hex');
                            END IF;
                            e_cur[sp] := k + 1;
                            sp := sp + 1;
                            e_kind[sp] := 'r'; e_pos[sp] := s_st[k]; e_endp[sp] := s_en[k];
                            e_m[sp] := s_ob[k]; e_mend[sp] := s_obend[k];
                        ELSE
                            nout := nout + 1;
                            outp[nout] := decode('7d', 'hex');
                            sp := sp - 1;
                        END IF;
                    END IF;
                END LOOP;
                SELECT string_agg(x.p, ''::bytea ORDER BY x.i) INTO canonical
                  FROM unnest(outp) WITH ORDINALITY AS x(p, i);
                RETURN encode(sha256(coalesce(canonical, ''::bytea)), 'hex');
            END IF;
            IF f_kind[top] = 'o' THEN                   -- the member is complete
                mcount := mcount + 1;
                m_dec[mcount] := f_kdec[top];
                m_st[mcount] := f_mst[top];
                m_en[mcount] := np;
                m_ob[mcount] := f_mob[top];
                m_obend[mcount] := no + 1;
            END IF;
            LOOP
                c := CASE WHEN pos < n THEN get_byte(b, pos) ELSE -1 END;
                EXIT WHEN c NOT IN (32, 9, 10, 13);
                pos := pos + 1;
            END LOOP;
            IF c = 44 THEN                              -- ,
                pos := pos + 1;
                IF f_kind[top] = 'a' THEN
                    IF glue AND octet_length(txt[np]) < 256 THEN
                        txt[np] := txt[np] || decode('2c', 'hex');
                    ELSE
                        np := np + 1;
                        txt[np] := decode('2c', 'hex');
                    END IF;
                    glue := true;
                END IF;
                want_key := f_kind[top] = 'o';
                CONTINUE main;
            ELSIF f_kind[top] = 'a' AND c = 93 THEN     -- ]
                pos := pos + 1;
                IF glue AND octet_length(txt[np]) < 256 THEN
                    txt[np] := txt[np] || decode('5d', 'hex');
                ELSE
                    np := np + 1;
                    txt[np] := decode('5d', 'hex');
                END IF;
                glue := true;
            ELSIF f_kind[top] = 'o' AND c = 125 THEN    -- }: keys in byte order, the last duplicate wins
                pos := pos + 1;
                -- This object's keys, copied one by one (never a slice of the whole stack), and
                -- the order of its members: by key, the last of equal keys only.
                t_dec := '{}';
                FOR i IN f_first[top] .. mcount LOOP
                    t_dec[i - f_first[top] + 1] := m_dec[i];
                END LOOP;
                SELECT coalesce(array_agg(u.i ORDER BY u.d), '{}') INTO t_st
                  FROM (SELECT DISTINCT ON (m.d) m.d, m.i
                          FROM unnest(t_dec) WITH ORDINALITY AS m(d, i)
                         ORDER BY m.d, m.i DESC) AS u;
                id := f_obj[top];
                o_end[id] := np;
                o_mfirst[id] := ns + 1;
                FOR i IN 1 .. coalesce(array_length(t_st, 1), 0) LOOP
                    k := f_first[top] - 1 + t_st[i];
                    ns := ns + 1;
                    s_st[ns] := m_st[k]; s_en[ns] := m_en[k]; s_ob[ns] := m_ob[k]; s_obend[ns] := m_obend[k];
                END LOOP;
                o_mlast[id] := ns;
                o_next[id] := no + 1;
                mcount := f_first[top] - 1;
                glue := false;                          -- its last piece ends it
            ELSE
                reason := CASE f_kind[top] WHEN 'a' THEN 'expected '','' or '']'' in an array'
                                           ELSE 'expected '','' or ''}'' in an object' END;
                EXIT main;
            END IF;
            top := top - 1;
        END LOOP;
    END LOOP;
    RAISE EXCEPTION 'request is not valid JSON at byte %: %', pos, reason USING ERRCODE = '22023';
END
$fn$;

-- The jsonb form hashes jsonb's own text, as the extension does (PL/pgSQL, as the text form may
-- be created after it).
CREATE FUNCTION @extschema@.idem_fingerprint(request jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    RETURN @extschema@.idem_fingerprint(request::text);
END
$fn$;

CREATE FUNCTION @extschema@.idem_fingerprint(request bytea) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$ SELECT encode(sha256(request), 'hex') $fn$;
