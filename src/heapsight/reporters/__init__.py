"""The output formats, one module each, beside one another:

  terminal     what run, compare, lab and attach print (rich: fits the width, colour on a
               terminal only)
  html         the self-contained page of `report` and of every command's --html (drawn by
               the machinery in heapsight.report: charts, thinning, PNG export)
  csv          compare's and lab's tables as comma-separated values (--csv)
  openmetrics  attach --watch's figures for Prometheus (--openmetrics-port)

A new format is a module here and the option that calls it in the command.
JSON needs no module: the documents are written as they are (output.write_json).
"""
