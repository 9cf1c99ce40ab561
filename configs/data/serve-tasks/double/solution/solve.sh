echo $(( $(cat n.txt) * 2 )) > out.txt
