$ASYNCPP bench schedule --kind pipedream --stages 3 --micro 3 --no-timeline
