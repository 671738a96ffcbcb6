$ASYNCPP tokenize encode -t x.tok --docs paragraphs a.txt
